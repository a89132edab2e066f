//! The data methods that `File` and `Fork` share, written once: each type provides
//! `fn target(&self, py) -> PyResult<Target>` and gets these in its `#[pymethods]` block.

/// Expands to `#[pymethods] impl $type { <its own methods> <the shared data methods> }`.
macro_rules! pymethods_with_data {
    ($type:ty { $($own:tt)* }) => {
        #[pyo3::pymethods]
        impl $type {
            $($own)*

            /// Reads `shape` into `buffer` (any contiguous writable buffer: bytearray, numpy
            /// array, memoryview); the shape's memory offsets index the buffer's bytes.
            /// Returns the bytes read.
            fn read(&self, py: Python<'_>, shape: PyRef<'_, $crate::shape::PyShape>, buffer: &Bound<'_, PyAny>) -> PyResult<u64> {
                $crate::io::read(py, self.target(py)?, &shape, buffer)
            }

            /// Writes `shape` from `buffer` (any contiguous buffer). Returns the bytes written.
            fn write(&self, py: Python<'_>, shape: PyRef<'_, $crate::shape::PyShape>, buffer: &Bound<'_, PyAny>) -> PyResult<u64> {
                $crate::io::write(py, self.target(py)?, &shape, buffer)
            }

            /// Non-blocking `read`: returns a `Handle` at once. The buffer must not be used
            /// until the handle is done.
            fn read_nb(&self, py: Python<'_>, shape: PyRef<'_, $crate::shape::PyShape>, buffer: &Bound<'_, PyAny>) -> PyResult<$crate::handle::PyHandle> {
                $crate::io::read_nb(py, self.target(py)?, &shape, buffer)
            }

            /// Non-blocking `write`.
            fn write_nb(&self, py: Python<'_>, shape: PyRef<'_, $crate::shape::PyShape>, buffer: &Bound<'_, PyAny>) -> PyResult<$crate::handle::PyHandle> {
                $crate::io::write_nb(py, self.target(py)?, &shape, buffer)
            }

            /// Fills `array` (any numpy view: C or Fortran order, sliced, transposed, reversed)
            /// with one nested-strided request, straight into its memory. Element
            /// `(i0, .., ik)` comes from byte `offset + Σ ij * file_strides[j]`; the default
            /// `file_strides` store the array densely in C order. Returns the bytes read.
            #[pyo3(signature = (array, offset = 0, file_strides = None))]
            fn read_into(&self, py: Python<'_>, array: &Bound<'_, PyAny>, offset: u64, file_strides: Option<Vec<i64>>) -> PyResult<u64> {
                $crate::io::read_into(py, self.target(py)?, array, offset, file_strides)
            }

            /// Writes `array` (any numpy view) with one nested-strided request, straight from
            /// its memory, to the places `read_into` reads from. Returns the bytes written.
            #[pyo3(signature = (array, offset = 0, file_strides = None))]
            fn write_from(&self, py: Python<'_>, array: &Bound<'_, PyAny>, offset: u64, file_strides: Option<Vec<i64>>) -> PyResult<u64> {
                $crate::io::write_from(py, self.target(py)?, array, offset, file_strides)
            }

            /// Allocates a numpy array of `shape` and `dtype` (`order` "C" or "F") and fills
            /// it as `read_into` does.
            #[pyo3(signature = (offset, shape, dtype, file_strides = None, order = "C"))]
            fn read_array<'py>(&self, py: Python<'py>, offset: u64, shape: &Bound<'py, PyAny>, dtype: &Bound<'py, PyAny>, file_strides: Option<Vec<i64>>, order: &str) -> PyResult<Bound<'py, PyAny>> {
                let target = self.target(py)?;
                let array = $crate::io::empty_array(py, shape, dtype, order)?;
                $crate::io::read_into(py, target, &array, offset, file_strides)?;
                Ok(array)
            }

            /// Non-blocking `read_into`: the handle's `wait()` gives the bytes read. The array
            /// must not be used until the handle is done.
            #[pyo3(signature = (array, offset = 0, file_strides = None))]
            fn read_into_nb(&self, py: Python<'_>, array: &Bound<'_, PyAny>, offset: u64, file_strides: Option<Vec<i64>>) -> PyResult<$crate::handle::PyHandle> {
                $crate::io::read_into_nb(py, self.target(py)?, array, offset, file_strides, None)
            }

            /// Non-blocking `write_from`. The array must not change until the handle is done.
            #[pyo3(signature = (array, offset = 0, file_strides = None))]
            fn write_from_nb(&self, py: Python<'_>, array: &Bound<'_, PyAny>, offset: u64, file_strides: Option<Vec<i64>>) -> PyResult<$crate::handle::PyHandle> {
                $crate::io::write_from_nb(py, self.target(py)?, array, offset, file_strides)
            }

            /// Non-blocking `read_array`: the handle's `wait()` gives the new array.
            #[pyo3(signature = (offset, shape, dtype, file_strides = None, order = "C"))]
            fn read_array_nb(&self, py: Python<'_>, offset: u64, shape: &Bound<'_, PyAny>, dtype: &Bound<'_, PyAny>, file_strides: Option<Vec<i64>>, order: &str) -> PyResult<$crate::handle::PyHandle> {
                let target = self.target(py)?;
                let array = $crate::io::empty_array(py, shape, dtype, order)?;
                let result = Some(array.clone().unbind());
                $crate::io::read_into_nb(py, target, &array, offset, file_strides, result)
            }
        }
    };
}

pub(crate) use pymethods_with_data;
