//! Linear files over layouts (stripe, hash, explicit) against a real cluster: every shape,
//! sizes and times as POSIX needs them, layouts on directories.

mod common;

use common::{cli, random_bytes, Cluster};
use flotilla_client::{CreateOptions, Layout, Shape, StrideLevel};

fn check_linear_file(cluster: &Cluster, path: &str, layout: Layout) {
    let client = cluster.client();
    let options = CreateOptions { subfiles: 4, layout: Some(layout), ..CreateOptions::default() };
    let file = client.create(path, &options).unwrap();
    let mut model = vec![0u8; 0];
    // Phase 1: contiguous writes at scattered offsets, crossing unit boundaries.
    for (i, (offset, length)) in
        [(0u64, 300_000usize), (1_000_000, 70_000), (123_457, 5_000), (2_999_000, 1_500)]
            .into_iter()
            .enumerate()
    {
        let data = random_bytes(i as u64, length);
        file.write_at(offset, &data).unwrap();
        let end = offset as usize + length;
        if model.len() < end {
            model.resize(end, 0);
        }
        model[offset as usize..end].copy_from_slice(&data);
        assert_eq!(file.size(), model.len() as u64, "this client sees its own size at once");
    }
    // Phase 2: a strided and a nested shape over the linear file.
    let strided = Shape::Strided {
        file_offset: 5,
        memory_offset: 0,
        record_bytes: 100,
        file_stride: 7_001,
        memory_stride: 100,
        count: 400,
    };
    let data = random_bytes(77, 40_000);
    file.write_shape(&strided, &data).unwrap();
    for piece in strided.pieces().unwrap() {
        let (f, m, l) = (piece.file_offset as usize, piece.memory_offset as usize, piece.length as usize);
        if model.len() < f + l {
            model.resize(f + l, 0);
        }
        model[f..f + l].copy_from_slice(&data[m..m + l]);
    }
    let levels = vec![
        StrideLevel { file_stride: 4096, memory_stride: 64, count: 16 },
        StrideLevel { file_stride: 300_000, memory_stride: 1024, count: 5 },
    ];
    let nested = Shape::Nested { file_offset: 17, memory_offset: 0, record_bytes: 64, levels };
    let mut back = vec![0u8; 5 * 1024];
    file.read_shape(&nested, &mut back).unwrap();
    for piece in nested.pieces().unwrap() {
        let (f, m, l) = (piece.file_offset as usize, piece.memory_offset as usize, piece.length as usize);
        assert_eq!(&back[m..m + l], &model[f..f + l], "nested piece {piece:?}");
    }
    // Records long enough to be read straight into the buffer, in descending memory order.
    let reversed = Shape::Strided {
        file_offset: 1_000,
        memory_offset: 9 * 6_000,
        record_bytes: 6_000,
        file_stride: 250_000,
        memory_stride: -6_000,
        count: 10,
    };
    let mut back = vec![0u8; 60_000];
    file.read_shape(&reversed, &mut back).unwrap();
    for piece in reversed.pieces().unwrap() {
        let (f, m, l) = (piece.file_offset as usize, piece.memory_offset as usize, piece.length as usize);
        assert_eq!(&back[m..m + l], &model[f..f + l], "reversed piece {piece:?}");
    }
    // Phase 3: the whole file reads back; another client sees the size only after close.
    let mut whole = vec![0u8; model.len() + 100];
    let read = file.read_at(0, &mut whole).unwrap();
    assert_eq!(read, model.len(), "read stops at end of file");
    assert!(whole[..read] == model[..], "linear file differs from the model");
    let other = cluster.client();
    assert_eq!(other.stat(path).unwrap().attrs.size_bytes, 0, "not published before close");
    file.close().unwrap();
    let published = other.stat(path).unwrap().attrs;
    assert_eq!(published.size_bytes, model.len() as u64);
    assert!(published.mtime_ns > 0);
    // Phase 4: shrinking truncates the forks; the tail reads as zeros after regrowth.
    let reopened = other.open(path).unwrap();
    reopened.set_size(150_000).unwrap();
    reopened.set_size(200_000).unwrap();
    let mut tail = vec![1u8; 50_000];
    assert_eq!(reopened.read_at(150_000, &mut tail).unwrap(), 50_000);
    assert!(tail.iter().all(|b| *b == 0), "bytes past a truncation must read as zeros");
}

#[test]
fn stripe_and_hash_files_hold_every_shape() {
    // Units smaller than the records need the layout bound lowered from its 4 KiB default.
    let cluster = Cluster::start_with(4, "layout_unit_bytes_min = 1000");
    check_linear_file(&cluster, "/striped", Layout::Stripe { unit_bytes: 65_536, count: 0 });
    check_linear_file(&cluster, "/small-units", Layout::Stripe { unit_bytes: 1000, count: 3 });
    check_linear_file(&cluster, "/hashed", Layout::Hash { block_bytes: 4096, sequentiality: 4, count: 0 });
}

#[test]
fn writers_of_disjoint_ranges_leave_the_larger_size() {
    let cluster = Cluster::start(2);
    let a = cluster.client();
    let b = cluster.client();
    let file_a = a.create("/shared", &CreateOptions::default()).unwrap();
    let file_b = b.open("/shared").unwrap();
    file_b.write_at(1 << 20, b"far").unwrap();
    file_a.write_at(0, b"near").unwrap();
    file_b.close().unwrap();
    file_a.close().unwrap();
    assert_eq!(cluster.client().stat("/shared").unwrap().attrs.size_bytes, (1 << 20) + 3);
}

#[test]
fn directories_pass_their_layout_on_and_explicit_files_have_no_linear_view() {
    let cluster = Cluster::start(3);
    let client = cluster.client();
    client.mkdir("/hashed", 0o755).unwrap();
    let meta = cluster.meta_addr();
    let (ok, stdout, stderr) = cli(&["layout", "set", "/hashed", "hash:8k:2:3", "--meta", &meta]);
    assert!(ok, "{stderr}");
    assert_eq!(stdout.trim(), "hash:8K:2:3");
    let file =
        client.create("/hashed/f", &CreateOptions { subfiles: 0, ..CreateOptions::default() }).unwrap();
    assert_eq!(file.layout(), Layout::Hash { block_bytes: 8192, sequentiality: 2, count: 3 });
    assert_eq!(file.subfile_count(), 3, "the layout's count sets the subfile count");
    let (ok, stdout, _) = cli(&["layout", "get", "/hashed/f", "--meta", &meta]);
    assert!(ok);
    assert_eq!(stdout.trim(), "hash:8K:2:3");

    let explicit = client
        .create("/explicit", &CreateOptions { layout: Some(Layout::Explicit), ..CreateOptions::default() })
        .unwrap();
    let error = explicit.write_at(0, b"x").expect_err("explicit files have no linear view");
    assert!(error.to_string().contains("explicit"), "{error}");
    explicit.fork(0, "data").unwrap().write(&Shape::contiguous(0, 1), b"x").unwrap();

    file.write_at(0, b"data").unwrap();
    file.close().unwrap();
    let (ok, _, stderr) = cli(&["layout", "set", "/hashed/f", "stripe:4k", "--meta", &meta]);
    assert!(!ok && stderr.contains("holds data"), "{stderr}");
}
