from typing import Optional, Sequence, Tuple

from . import errors as errors
from ._native import STRIDE_LEVELS_MAX as STRIDE_LEVELS_MAX
from ._native import BatchNode as BatchNode
from ._native import Client as Client
from ._native import DirEntry as DirEntry
from ._native import File as File
from ._native import Fork as Fork
from ._native import Group as Group
from ._native import Handle as Handle
from ._native import Shape as Shape
from ._native import Stat as Stat
from .errors import AlreadyExistsError as AlreadyExistsError
from .errors import ClosedError as ClosedError
from .errors import Error as Error
from .errors import InvalidRequestError as InvalidRequestError
from .errors import IsADirectory as IsADirectory
from .errors import NoSpaceError as NoSpaceError
from .errors import NotADirectory as NotADirectory
from .errors import NotEmptyError as NotEmptyError
from .errors import NotFoundError as NotFoundError
from .errors import OverLimitError as OverLimitError
from .errors import PermissionDeniedError as PermissionDeniedError
from .errors import ServerError as ServerError
from .errors import UnavailableError as UnavailableError

__version__: str
META_ENV: str

def connect(meta: Optional[str] = None) -> Client: ...
def contiguous(file_offset: int, length: int, memory_offset: int = 0) -> Shape: ...
def strided(
    file_offset: int,
    record_bytes: int,
    file_stride: int,
    count: int,
    memory_stride: Optional[int] = None,
    memory_offset: int = 0,
) -> Shape: ...
def nested(
    file_offset: int, record_bytes: int, levels: Sequence[Tuple[int, int, int]], memory_offset: int = 0
) -> Shape: ...
def batched(nodes: Sequence[BatchNode]) -> Shape: ...
def pieces(pieces: Sequence[Tuple[int, int, int]]) -> Shape: ...
