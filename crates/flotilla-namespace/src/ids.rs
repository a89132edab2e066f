//! Inode ids: a keyed permutation of a counter (schema version 3).
//!
//! A new inode takes the next value of the persistent counter `inode_seq` (in `counters`,
//! advanced in the creating transaction) and is stored in `inodes_by_seq` under that
//! sequence number, so creates insert into the last leaf of the table instead of a random
//! one. Its public id is `E_k(seq)`: Blowfish (the RustCrypto `blowfish` crate, through the
//! `cipher` traits) encrypting the sequence number as one 64-bit block under a 128-bit key
//! drawn from the operating system's random source when the database is created and kept
//! in the database's `keys` table. The key never leaves the metadata service, so to a
//! client the ids of consecutive creates look unrelated and an id it was not given is as
//! hard to guess as a random 64-bit number (see docs/architecture-log.md, "Inode ids:
//! a keyed permutation of a counter").
//!
//! The root directory is sequence number 0 and keeps id [`ROOT_ID`]; every other sequence
//! number whose id would be 0 or [`ROOT_ID`] is never handed out. Inodes created before
//! version 3 keep their random ids in the `inodes` table (the *legacy* table).

use crate::codec::{Reader, Writer};
use crate::error::NamespaceError;
use crate::schema::ROOT_ID;
use blowfish::cipher::generic_array::GenericArray;
use blowfish::cipher::{BlockDecrypt, BlockEncrypt, KeyInit};
use blowfish::Blowfish;

/// Bytes of the id key (Blowfish takes 4 to 56; 16 is 128 bits).
pub const ID_KEY_BYTES: usize = 16;
/// Format version of the key record (the value of `keys["inode_ids"]`).
const KEY_FORMAT_VERSION: u8 = 1;
/// Sequence number of the root directory.
pub(crate) const ROOT_SEQ: u64 = 0;

/// Maps between sequence numbers and public inode ids with the database's key. Never
/// prints the key.
#[derive(Clone)]
pub(crate) struct InodeIds {
    cipher: Blowfish,
    /// The database has inodes from before version 3 in the legacy `inodes` table (fixed at
    /// open: version 3 never adds rows to it, so `false` stays true).
    pub(crate) legacy: bool,
}

impl std::fmt::Debug for InodeIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InodeIds").field("key", &"(hidden)").field("legacy", &self.legacy).finish()
    }
}

impl InodeIds {
    pub(crate) fn new(key: &[u8; ID_KEY_BYTES], legacy: bool) -> Self {
        let cipher = Blowfish::new_from_slice(key).expect("Blowfish takes a 16-byte key");
        Self { cipher, legacy }
    }

    /// A fresh key from the operating system's random source.
    pub(crate) fn draw_key() -> Result<[u8; ID_KEY_BYTES], NamespaceError> {
        use rand::TryRngCore;
        let mut key = [0u8; ID_KEY_BYTES];
        rand::rngs::OsRng
            .try_fill_bytes(&mut key)
            .map_err(|error| NamespaceError::Storage(format!("no random key from the OS: {error}")))?;
        Ok(key)
    }

    /// `E_k(value)`: the keyed permutation of u64.
    pub(crate) fn encrypt(&self, value: u64) -> u64 {
        let mut block = GenericArray::from(value.to_be_bytes());
        self.cipher.encrypt_block(&mut block);
        u64::from_be_bytes(block.into())
    }

    /// `E_k⁻¹(value)`.
    pub(crate) fn decrypt(&self, value: u64) -> u64 {
        let mut block = GenericArray::from(value.to_be_bytes());
        self.cipher.decrypt_block(&mut block);
        u64::from_be_bytes(block.into())
    }

    /// The public id of sequence number `seq`: [`ROOT_ID`] for the root's, else
    /// `E_k(seq)`. A result of 0 or [`ROOT_ID`] for `seq > 0` is reserved: that sequence
    /// number is skipped, never stored (see [`Self::usable`]).
    pub(crate) fn id_of(&self, seq: u64) -> u64 {
        if seq == ROOT_SEQ {
            ROOT_ID
        } else {
            self.encrypt(seq)
        }
    }

    /// Whether a new inode may take sequence number `seq` as far as the id alone tells
    /// (the legacy table is checked by the caller).
    pub(crate) fn usable(&self, seq: u64, id: u64) -> bool {
        seq != ROOT_SEQ && id > ROOT_ID
    }

    /// The sequence number that id `id` would be stored under, or `None` for an id that no
    /// inode of `inodes_by_seq` can have (0, or an id that decrypts to the root's number).
    pub(crate) fn seq_of(&self, id: u64) -> Option<u64> {
        match id {
            0 => None,
            ROOT_ID => Some(ROOT_SEQ),
            _ => Some(self.decrypt(id)).filter(|seq| *seq != ROOT_SEQ),
        }
    }

    /// The key record: version byte, the key, CRC32C.
    pub(crate) fn encode_key(key: &[u8; ID_KEY_BYTES]) -> Vec<u8> {
        let mut writer = Writer::new(KEY_FORMAT_VERSION);
        writer.raw(key);
        writer.finish()
    }

    pub(crate) fn decode_key(record: &[u8]) -> Result<[u8; ID_KEY_BYTES], NamespaceError> {
        let mut reader = Reader::open("id key", record, KEY_FORMAT_VERSION)?;
        let mut key = [0u8; ID_KEY_BYTES];
        key.copy_from_slice(reader.take(ID_KEY_BYTES)?);
        reader.finish()?;
        Ok(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    fn ids(key: [u8; ID_KEY_BYTES]) -> InodeIds {
        InodeIds::new(&key, false)
    }

    proptest! {
        #[test]
        fn the_permutation_round_trips(key in any::<[u8; ID_KEY_BYTES]>(), values in proptest::collection::vec(any::<u64>(), 1..200)) {
            let ids = ids(key);
            let mut images = HashSet::new();
            let distinct: HashSet<u64> = values.iter().copied().collect();
            for value in &distinct {
                let image = ids.encrypt(*value);
                prop_assert_eq!(ids.decrypt(image), *value);
                prop_assert!(images.insert(image), "two values share the image {:016x}", image);
            }
        }

        #[test]
        fn seq_and_id_round_trip(key in any::<[u8; ID_KEY_BYTES]>(), seq in 1u64..u64::MAX) {
            let ids = ids(key);
            let id = ids.id_of(seq);
            if ids.usable(seq, id) {
                prop_assert_eq!(ids.seq_of(id), Some(seq));
            }
        }
    }

    #[test]
    fn consecutive_sequence_numbers_give_unrelated_ids() {
        let ids = ids(InodeIds::draw_key().unwrap());
        let images: Vec<u64> = (1..=1000).map(|seq| ids.id_of(seq)).collect();
        let distinct: HashSet<u64> = images.iter().copied().collect();
        assert_eq!(distinct.len(), images.len(), "a bijection on 1..=1000");
        let rising = images.windows(2).filter(|pair| pair[1] > pair[0]).count();
        assert!((350..=650).contains(&rising), "{rising} of 999 steps go up: not monotone");
        let close = images.windows(2).filter(|pair| pair[0].abs_diff(pair[1]) < 1 << 40).count();
        assert_eq!(close, 0, "no two consecutive ids within 2^40 of each other");
        // About half of the 64 bits differ between neighbours, as between random numbers.
        let flipped: u32 = images.windows(2).map(|pair| (pair[0] ^ pair[1]).count_ones()).sum();
        let mean = f64::from(flipped) / 999.0;
        assert!((28.0..=36.0).contains(&mean), "{mean} bits differ on average");
    }

    #[test]
    fn the_root_and_reserved_ids() {
        let ids = ids([7; ID_KEY_BYTES]);
        assert_eq!(ids.id_of(ROOT_SEQ), ROOT_ID);
        assert_eq!(ids.seq_of(ROOT_ID), Some(ROOT_SEQ));
        assert_eq!(ids.seq_of(0), None);
        // The id that encrypts the root's number is nobody's id.
        assert_eq!(ids.seq_of(ids.encrypt(ROOT_SEQ)), None);
        // The sequence numbers whose ids are reserved are not usable.
        let (zero, one) = (ids.decrypt(0), ids.decrypt(ROOT_ID));
        assert!(!ids.usable(zero, ids.id_of(zero)));
        assert!(!ids.usable(one, ids.id_of(one)));
    }

    #[test]
    fn keys_differ_and_their_record_round_trips() {
        let (a, b) = (InodeIds::draw_key().unwrap(), InodeIds::draw_key().unwrap());
        assert_ne!(a, b);
        let record = InodeIds::encode_key(&a);
        assert_eq!(record.len(), 1 + ID_KEY_BYTES + 4);
        assert_eq!(InodeIds::decode_key(&record).unwrap(), a);
        let mut damaged = record.clone();
        damaged[3] ^= 1;
        assert!(InodeIds::decode_key(&damaged).is_err());
        assert!(InodeIds::decode_key(&record[..10]).is_err());
    }
}
