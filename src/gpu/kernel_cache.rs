//! The on-disk cache of compiled kernels (one file per program and target), hardened because
//! its bytes go to the driver's module loader, which trusts them: a short or corrupted file
//! would make the driver read past the buffer or run the wrong code, and anyone who can
//! write the directory could plant GPU code.
//!
//! A file is a header, then the image: magic (8 bytes), payload length (u64 LE), SHA-256 of
//! the payload, SHA-256 of the key (what the image was compiled from). Only a file that is a
//! regular file owned by this user with no access for others, in a directory owned by this
//! user with mode 0700, whose length and both checksums match, is handed out. Files are
//! written to a temporary name unique per process and thread (pid, thread id, counter),
//! created with `create_new` and mode 0600, synced, then renamed over the entry, so readers
//! see a whole old or a whole new file. Every failure is an error string for the log; the
//! caller then compiles (and stores again where it can).

use super::sha256::sha256;
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

pub const MAGIC: &[u8; 8] = b"RFKCACH1";
pub const HEADER: usize = 8 + 8 + 32 + 32;
/// Largest image accepted (a sanity bound against absurd length fields).
const MAX_IMAGE: u64 = 1 << 30;

/// A cache directory that passed the ownership and permission checks.
#[derive(Debug)]
pub struct Cache {
    dir: PathBuf,
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether a directory (or file) with this owner and mode may hold cached kernels for user
/// `uid`: owned by `uid`, no access for group or others.
pub fn private_to(owner: u32, mode: u32, uid: u32) -> Result<(), String> {
    if owner != uid {
        return Err(format!("owned by uid {owner}, not by this user ({uid})"));
    }
    if mode & 0o077 != 0 {
        return Err(format!(
            "mode {:o} gives access to others (0700 / 0600 wanted)",
            mode & 0o7777
        ));
    }
    Ok(())
}

impl Cache {
    /// Opens `dir`, creating it (and its missing parents) with mode 0700. A directory of this
    /// user that others may access is narrowed to 0700 (it was made under the umask by older
    /// versions); one of another user, a symbolic link or a non-directory is refused.
    pub fn open(dir: &Path) -> Result<Cache, String> {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let meta = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        if !meta.file_type().is_dir() {
            return Err(format!(
                "{} is not a directory (or is a symbolic link)",
                dir.display()
            ));
        }
        let uid = euid();
        if meta.uid() != uid {
            return Err(format!(
                "{}: {}",
                dir.display(),
                private_to(meta.uid(), meta.mode(), uid).unwrap_err()
            ));
        }
        if meta.mode() & 0o077 != 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| format!("cannot make {} private (0700): {e}", dir.display()))?;
            crate::log_info!("kernel cache {}: mode set to 0700", dir.display());
        }
        // Writable by us? (A read-only directory of ours still serves hits.)
        Ok(Cache {
            dir: dir.to_path_buf(),
        })
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The image stored under `name` for `key`: Ok(None) when there is none, Err when a file
    /// is there but not usable (the caller logs it and evicts it).
    pub fn load(&self, name: &str, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
        let path = self.path(name);
        let file = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let meta = file
            .metadata()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if !meta.file_type().is_file() {
            return Err(format!("{} is not a regular file", path.display()));
        }
        private_to(meta.uid(), meta.mode(), euid())
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let mut bytes = Vec::with_capacity(meta.len().min(MAX_IMAGE + HEADER as u64) as usize);
        file.take(MAX_IMAGE + HEADER as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        parse(&bytes, key)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Stores `image` under `name` for `key` (temporary file, fsync, rename).
    pub fn store(&self, name: &str, key: &[u8], image: &[u8]) -> Result<(), String> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) };
        let tmp = self.dir.join(format!(
            ".{name}.tmp.{}.{tid}.{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let write = || -> std::io::Result<()> {
            let mut f: File = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&tmp)?;
            f.write_all(&header(image, key))?;
            f.write_all(image)?;
            f.sync_all()?;
            std::fs::rename(&tmp, self.path(name))?;
            // The rename itself durable too (best effort: not every filesystem syncs dirs).
            if let Ok(d) = File::open(&self.dir) {
                let _ = d.sync_all();
            }
            Ok(())
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!("cannot store {} in {}: {e}", name, self.dir.display())
        })
    }

    /// Removes the entry `name` (an unusable file); failure is only logged.
    pub fn evict(&self, name: &str) {
        let path = self.path(name);
        if let Err(e) = std::fs::remove_file(&path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                crate::log_warn!("cannot remove {}: {e}", path.display());
            }
        }
    }
}

/// The header of `image` stored for `key`.
pub fn header(image: &[u8], key: &[u8]) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(MAGIC);
    h[8..16].copy_from_slice(&(image.len() as u64).to_le_bytes());
    h[16..48].copy_from_slice(&sha256(image));
    h[48..80].copy_from_slice(&sha256(key));
    h
}

/// The payload of a whole cache file, after checking magic, length and both checksums.
pub fn parse(bytes: &[u8], key: &[u8]) -> Result<Vec<u8>, String> {
    if bytes.len() < HEADER {
        return Err(format!(
            "{} bytes: shorter than the {HEADER}-byte header",
            bytes.len()
        ));
    }
    if &bytes[..8] != MAGIC {
        return Err("not a rocmforge kernel cache file (magic)".into());
    }
    let len = u64::from_le_bytes(bytes[8..16].try_into().unwrap_or([0xff; 8]));
    let payload = &bytes[HEADER..];
    if len > MAX_IMAGE || len != payload.len() as u64 {
        return Err(format!(
            "length {} in the header, {} bytes present (truncated or extended)",
            len,
            payload.len()
        ));
    }
    if len == 0 {
        return Err("empty image".into());
    }
    if bytes[48..80] != sha256(key) {
        return Err("compiled from another source or options (key checksum)".into());
    }
    if bytes[16..48] != sha256(payload) {
        return Err("image checksum mismatch (corrupted)".into());
    }
    Ok(payload.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system temp dir (removed by the test).
    fn tmpdir(tag: &str) -> PathBuf {
        static N: AtomicU64 = AtomicU64::new(0);
        let d = std::env::temp_dir().join(format!(
            "rf-kcache-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    const KEY: &[u8] = b"CUDA\0sm_90\0nvrtc 13.0\0-DRF_WARP_SIZE=32\0source";

    fn image() -> Vec<u8> {
        (0..5000u32).map(|i| (i * 7 + 3) as u8).collect()
    }

    #[test]
    fn stores_and_loads_with_private_modes() {
        let d = tmpdir("roundtrip");
        let c = Cache::open(&d).unwrap();
        assert_eq!(c.load("k.bin", KEY).unwrap(), None, "absent entry");
        c.store("k.bin", KEY, &image()).unwrap();
        assert_eq!(c.load("k.bin", KEY).unwrap(), Some(image()));
        let dm = std::fs::metadata(&d).unwrap().mode() & 0o777;
        let fm = std::fs::metadata(c.path("k.bin")).unwrap().mode() & 0o777;
        assert_eq!((dm, fm), (0o700, 0o600));
        // No temporary file left behind.
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn rejects_truncated_corrupted_empty_and_foreign_files() {
        let d = tmpdir("bad");
        let c = Cache::open(&d).unwrap();
        c.store("k.bin", KEY, &image()).unwrap();
        let good = std::fs::read(c.path("k.bin")).unwrap();
        let put = |bytes: &[u8]| {
            std::fs::write(c.path("k.bin"), bytes).unwrap();
            std::fs::set_permissions(c.path("k.bin"), std::fs::Permissions::from_mode(0o600))
                .unwrap();
        };
        put(&good[..good.len() - 1]);
        assert!(c.load("k.bin", KEY).unwrap_err().contains("truncated"));
        put(&good[..40]);
        assert!(c.load("k.bin", KEY).unwrap_err().contains("header"));
        put(&[]);
        assert!(c.load("k.bin", KEY).is_err(), "0-byte file");
        let mut bad = good.clone();
        bad[HEADER + 100] ^= 1;
        put(&bad);
        assert!(c.load("k.bin", KEY).unwrap_err().contains("corrupted"));
        let mut extended = good.clone();
        extended.push(0);
        put(&extended);
        assert!(c.load("k.bin", KEY).is_err(), "extra byte");
        put(&image());
        assert!(
            c.load("k.bin", KEY).unwrap_err().contains("magic"),
            "a raw image"
        );
        put(&good);
        assert!(
            c.load("k.bin", b"other key").unwrap_err().contains("key"),
            "wrong key"
        );
        assert_eq!(c.load("k.bin", KEY).unwrap(), Some(image()));
        // A header claiming 0 bytes.
        put(&header(&[], KEY));
        assert!(c.load("k.bin", KEY).is_err());
        // Readable by others: refused whatever its contents.
        put(&good);
        std::fs::set_permissions(c.path("k.bin"), std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(c.load("k.bin", KEY).unwrap_err().contains("mode"));
        // A symbolic link in place of the entry: refused.
        std::fs::remove_file(c.path("k.bin")).unwrap();
        let target = d.join("target.bin");
        std::fs::write(&target, &good).unwrap();
        std::os::unix::fs::symlink(&target, c.path("k.bin")).unwrap();
        assert!(c.load("k.bin", KEY).is_err(), "symlink");
        c.evict("k.bin");
        assert_eq!(c.load("k.bin", KEY).unwrap(), None);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn ownership_and_mode_rules() {
        assert!(private_to(1000, 0o40700, 1000).is_ok());
        assert!(private_to(1000, 0o100600, 1000).is_ok());
        assert!(private_to(0, 0o40700, 1000).unwrap_err().contains("owned"));
        assert!(private_to(1000, 0o40770, 1000)
            .unwrap_err()
            .contains("mode"));
        assert!(private_to(1000, 0o40707, 1000).is_err());
        assert!(private_to(1000, 0o100640, 1000).is_err());
    }

    #[test]
    fn open_narrows_an_open_directory_and_refuses_links_and_files() {
        let d = tmpdir("modes");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        Cache::open(&d).unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        let link = PathBuf::from(format!("{}-link", d.display()));
        std::os::unix::fs::symlink(&d, &link).unwrap();
        assert!(Cache::open(&link).is_err(), "a symbolic link");
        let file = d.join("plain");
        std::fs::write(&file, b"x").unwrap();
        assert!(Cache::open(&file).is_err(), "a file");
        std::fs::remove_file(&link).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn unwritable_directory_fails_to_store_but_still_loads() {
        let d = tmpdir("ro");
        let c = Cache::open(&d).unwrap();
        c.store("a.bin", KEY, &image()).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o500)).unwrap();
        // root writes anyway: then there is nothing to observe.
        let probe = d.join("probe");
        let root = std::fs::write(&probe, b"x").is_ok();
        if !root {
            assert!(c.store("b.bin", KEY, &image()).is_err());
            assert_eq!(c.load("a.bin", KEY).unwrap(), Some(image()));
        }
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        // A path below a file cannot be made at all.
        let under = d.join("a.bin").join("sub");
        assert!(Cache::open(&under).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn two_threads_writing_one_entry_leave_a_whole_file() {
        let d = tmpdir("race");
        let c = std::sync::Arc::new(Cache::open(&d).unwrap());
        let imgs: Vec<Vec<u8>> = (0..2u8)
            .map(|t| (0..200_000u32).map(|i| (i as u8) ^ t).collect())
            .collect();
        let all = &imgs;
        std::thread::scope(|s| {
            for img in all {
                let c = c.clone();
                s.spawn(move || {
                    for _ in 0..20 {
                        c.store("k.bin", KEY, img).unwrap();
                        let got = c.load("k.bin", KEY).unwrap().unwrap();
                        assert!(all.contains(&got), "a torn file");
                    }
                });
            }
        });
        let got = c.load("k.bin", KEY).unwrap().unwrap();
        assert!(imgs.contains(&got));
        assert_eq!(
            std::fs::read_dir(&d).unwrap().count(),
            1,
            "temporary files left"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
