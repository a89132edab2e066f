//! The rate of each candidate frame MAC, and of CRC32C and memcpy, over 256 KiB buffers (best of 5).
use std::time::Instant;
fn rate(name: &str, bytes: usize, f: impl Fn()) {
    f();
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!("{name:>28}: {:.2} GB/s", bytes as f64 / best / 1e9);
}
fn main() {
    let data = vec![7u8; 256 << 10];
    let rounds = 400;
    let total = data.len() * rounds;
    let key = [3u8; 32];
    rate("blake3 keyed (update)", total, || {
        for _ in 0..rounds {
            let mut h = blake3::Hasher::new_keyed(&key);
            h.update(&data);
            std::hint::black_box(h.finalize());
        }
    });
    rate("blake3 keyed (64K pieces)", total, || {
        for _ in 0..rounds {
            let mut h = blake3::Hasher::new_keyed(&key);
            for c in data.chunks(64 << 10) {
                h.update(c);
            }
            std::hint::black_box(h.finalize());
        }
    });
    let k =
        ring::aead::LessSafeKey::new(ring::aead::UnboundKey::new(&ring::aead::AES_256_GCM, &key).unwrap());
    rate("ring AES-256-GCM, data as AAD", total, || {
        for i in 0..rounds {
            let mut n = [0u8; 12];
            n[..8].copy_from_slice(&(i as u64).to_le_bytes());
            let mut empty: [u8; 0] = [];
            let _ = std::hint::black_box(
                k.seal_in_place_separate_tag(
                    ring::aead::Nonce::assume_unique_for_key(n),
                    ring::aead::Aad::from(&data[..]),
                    &mut empty[..],
                )
                .unwrap(),
            );
        }
    });
    let c = ring::aead::LessSafeKey::new(
        ring::aead::UnboundKey::new(&ring::aead::CHACHA20_POLY1305, &key).unwrap(),
    );
    rate("ring ChaCha20Poly1305 AAD", total, || {
        for i in 0..rounds {
            let mut n = [0u8; 12];
            n[..8].copy_from_slice(&(i as u64).to_le_bytes());
            let mut empty: [u8; 0] = [];
            let _ = std::hint::black_box(
                c.seal_in_place_separate_tag(
                    ring::aead::Nonce::assume_unique_for_key(n),
                    ring::aead::Aad::from(&data[..]),
                    &mut empty[..],
                )
                .unwrap(),
            );
        }
    });
    let buf = data.clone();
    rate("ring AES-256-GCM encrypt", total, || {
        let mut buf = buf.clone();
        for i in 0..rounds {
            let mut n = [0u8; 12];
            n[..8].copy_from_slice(&(i as u64).to_le_bytes());
            let _ = std::hint::black_box(
                k.seal_in_place_separate_tag(
                    ring::aead::Nonce::assume_unique_for_key(n),
                    ring::aead::Aad::empty(),
                    &mut buf[..],
                )
                .unwrap(),
            );
        }
    });

    use poly1305::universal_hash::{KeyInit, UniversalHash};
    rate("poly1305 (RustCrypto)", total, || {
        for _ in 0..rounds {
            let mut p = poly1305::Poly1305::new(&key.into());
            p.update_padded(&data);
            std::hint::black_box(p.finalize());
        }
    });
    rate("polyval (RustCrypto)", total, || {
        let k16 = [5u8; 16];
        for _ in 0..rounds {
            let mut p = polyval::Polyval::new(&k16.into());
            p.update_padded(&data);
            std::hint::black_box(p.finalize());
        }
    });
    rate("crc32c", total, || {
        for _ in 0..rounds {
            std::hint::black_box(crc32c::crc32c(&data));
        }
    });
    rate("memcpy", total, || {
        let mut d = vec![0u8; data.len()];
        for _ in 0..rounds {
            d.copy_from_slice(&data);
            std::hint::black_box(&d);
        }
    });
}
