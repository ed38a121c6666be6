//! Key and value generation for the write workloads: fixed-size, printable keys drawn from a
//! key space, sequentially (by operation index) or uniformly at random from a seeded generator.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::BenchError;

/// Largest key etcd accepts in a request is bounded by the request size; we bound the
/// generated key far below it.
pub const MAX_KEY_SIZE: usize = 64 * 1024;
/// Largest value a benchmark writes (etcd's default request limit is 1.5 MiB).
pub const MAX_VAL_SIZE: usize = 1024 * 1024;

/// Checks that `key_space` distinct keys fit in keys of `key_size` bytes after `prefix`.
pub fn validate(prefix: &[u8], key_size: usize, key_space: u64) -> Result<(), BenchError> {
    if key_space == 0 {
        return Err(BenchError::InvalidArgs(
            "--key-space-size must be at least 1".into(),
        ));
    }
    if key_size > MAX_KEY_SIZE {
        return Err(BenchError::InvalidArgs(format!(
            "--key-size {key_size} exceeds {MAX_KEY_SIZE}"
        )));
    }
    let digits = digits_needed(key_space);
    if key_size < prefix.len() + digits {
        return Err(BenchError::InvalidArgs(format!(
            "--key-size {key_size} is too small for --key-space-size {key_space}: needs at least {} bytes ({} of prefix, {digits} digits)",
            prefix.len() + digits,
            prefix.len()
        )));
    }
    Ok(())
}

/// Decimal digits needed to write every index in `0..key_space`.
pub fn digits_needed(key_space: u64) -> usize {
    let mut max = key_space.saturating_sub(1);
    let mut digits = 1;
    while max >= 10 {
        max /= 10;
        digits += 1;
    }
    digits
}

/// Chooses keys for one client. Keys are `prefix` followed by the key index, zero-padded to
/// exactly `key_size` bytes, so distinct indexes give distinct keys and every key has one size.
pub struct KeyGen {
    prefix: Vec<u8>,
    key_size: usize,
    key_space: u64,
    sequential: bool,
    rng: StdRng,
}

impl KeyGen {
    /// `seed` makes random choices replayable; callers mix in the client index.
    pub fn new(
        prefix: &[u8],
        key_size: usize,
        key_space: u64,
        sequential: bool,
        seed: u64,
    ) -> Result<Self, BenchError> {
        validate(prefix, key_size, key_space)?;
        Ok(Self {
            prefix: prefix.to_vec(),
            key_size,
            key_space,
            sequential,
            rng: StdRng::seed_from_u64(seed),
        })
    }

    /// The key index for operation `op` (a global operation counter).
    pub fn index(&mut self, op: u64) -> u64 {
        if self.sequential {
            op % self.key_space
        } else {
            self.rng.random_range(0..self.key_space)
        }
    }

    /// The key for operation `op`.
    pub fn key(&mut self, op: u64) -> Vec<u8> {
        let index = self.index(op);
        self.key_of(index)
    }

    /// The key of index `index`.
    pub fn key_of(&self, index: u64) -> Vec<u8> {
        key_of(&self.prefix, self.key_size, index)
    }
}

/// `prefix` + `index` zero-padded so the whole key is `key_size` bytes (longer if the index
/// needs more digits, which `validate` rules out for indexes inside the key space).
pub fn key_of(prefix: &[u8], key_size: usize, index: u64) -> Vec<u8> {
    let width = key_size.saturating_sub(prefix.len());
    let mut key = prefix.to_vec();
    key.extend_from_slice(format!("{index:0width$}").as_bytes());
    key
}

/// A printable value of `size` bytes from a seeded generator.
pub fn value(size: usize, seed: u64) -> Vec<u8> {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = StdRng::seed_from_u64(seed);
    (0..size)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_have_fixed_size_and_are_distinct() {
        let mut g = KeyGen::new(b"", 8, 1000, true, 1).unwrap();
        let keys: Vec<_> = (0..1000).map(|i| g.key(i)).collect();
        assert!(keys.iter().all(|k| k.len() == 8));
        let set: std::collections::BTreeSet<_> = keys.iter().collect();
        assert_eq!(set.len(), 1000);
        assert_eq!(keys[0], b"00000000");
        assert_eq!(keys[999], b"00000999");
        // sequential keys wrap around the key space
        assert_eq!(g.key(1000), b"00000000");
        assert_eq!(g.key(1234), b"00000234");
    }

    #[test]
    fn prefixed_keys() {
        let g = KeyGen::new(b"bench/", 10, 10, false, 1).unwrap();
        assert_eq!(g.key_of(7), b"bench/0007");
    }

    #[test]
    fn random_keys_stay_in_space_and_replay_by_seed() {
        let mut a = KeyGen::new(b"", 4, 10, false, 42).unwrap();
        let mut b = KeyGen::new(b"", 4, 10, false, 42).unwrap();
        let xs: Vec<u64> = (0..200).map(|i| a.index(i)).collect();
        let ys: Vec<u64> = (0..200).map(|i| b.index(i)).collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().all(|&x| x < 10));
        // 200 uniform draws over 10 keys touch more than one key
        assert!(xs.iter().collect::<std::collections::BTreeSet<_>>().len() > 1);
    }

    #[test]
    fn validation() {
        assert!(validate(b"", 8, 0).is_err());
        assert!(validate(b"", 2, 100).is_ok()); // 0..=99
        assert!(validate(b"", 2, 101).is_err()); // 100 needs 3 digits
        assert!(validate(b"abc", 4, 11).is_err());
        assert!(validate(b"abc", 5, 11).is_ok());
        assert!(validate(b"", MAX_KEY_SIZE + 1, 1).is_err());
        assert_eq!(digits_needed(1), 1);
        assert_eq!(digits_needed(10), 1);
        assert_eq!(digits_needed(11), 2);
        assert_eq!(digits_needed(u64::MAX), 20);
    }

    #[test]
    fn values_and_range_ends() {
        let v = value(256, 7);
        assert_eq!(v.len(), 256);
        assert_eq!(v, value(256, 7));
        assert!(v.iter().all(u8::is_ascii_alphanumeric));
    }
}
