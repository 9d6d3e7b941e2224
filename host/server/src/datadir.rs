//! The data folder holds the embedded database, the HMAC secret, the operator and dev keys
//! and the compiled-component cache: whoever reads it can read every tenant's runs and
//! mint keys. It is made private to the user running wasq before anything is opened.
//!
//! The choice for a folder left open by an earlier version or by hand: tighten it (folder
//! 0700, wasq's own files 0600) and log what changed, since refusing would only make the
//! operator type the same `chmod`. Except when other users could *write* to it: files in it
//! may have been planted or swapped (a symlinked database), so wasq refuses to start.
//! Files created later are born private: `wasq` sets its umask to 077 (cli), SQLite gives
//! `-wal`/`-shm` the database file's mode, and the database file is created 0600.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

use crate::ServerError;

/// Files wasq itself writes directly in the data folder.
const OWN_FILES: [&str; 8] = [
    "wasq.db",
    "wasq.db-wal",
    "wasq.db-shm",
    "wasq.db-journal",
    "secret",
    "admin.key",
    "dev.key",
    "lock",
];

const PRIVATE_DIR: u32 = 0o700;
const PRIVATE_FILE: u32 = 0o600;

/// Creates the data folder (and the cache folder) owner-only, or makes existing ones so,
/// with the files wasq keeps in them.
pub(crate) fn prepare(dir: &Path, cache: Option<&Path>) -> Result<(), ServerError> {
    private_dir(dir)?;
    for name in OWN_FILES {
        private_file(&dir.join(name))?;
    }
    if let Some(cache) = cache {
        private_dir(cache)?;
        let entries = std::fs::read_dir(cache).map_err(|source| ServerError::DataDir {
            path: cache.to_path_buf(),
            source,
        })?;
        for entry in entries.flatten() {
            private_file(&entry.path())?;
        }
    }
    Ok(())
}

fn private_dir(dir: &Path) -> Result<(), ServerError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_DIR)
        .create(dir)
        .map_err(|source| ServerError::DataDir {
            path: dir.to_path_buf(),
            source,
        })?;
    let meta = std::fs::metadata(dir).map_err(|source| ServerError::DataDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o002 != 0 {
        return Err(ServerError::DataDirUnsafe {
            path: dir.to_path_buf(),
            mode,
        });
    }
    tighten(dir, mode, PRIVATE_DIR)
}

/// A regular file of wasq's, if it exists; anything else under that name is left alone
/// (a symlink would make chmod act on its target).
fn private_file(path: &Path) -> Result<(), ServerError> {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !meta.is_file() {
        return Ok(());
    }
    tighten(path, meta.permissions().mode() & 0o7777, PRIVATE_FILE)
}

fn tighten(path: &Path, mode: u32, private: u32) -> Result<(), ServerError> {
    if mode & 0o077 == 0 {
        return Ok(());
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(private)).map_err(|source| {
        ServerError::DataDirLoose {
            path: path.to_path_buf(),
            mode,
            source,
        }
    })?;
    tracing::warn!(
        path = %path.display(),
        "{} was open to other users (mode {mode:03o}): made it {private:03o}",
        path.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn loose_folders_and_files_are_made_private() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        let cache = dir.join("cache");
        std::fs::create_dir_all(&cache).unwrap();
        for (p, m) in [(&dir, 0o755), (&cache, 0o775)] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
        }
        let files = [
            dir.join("wasq.db"),
            dir.join("secret"),
            cache.join("a.cwasm"),
        ];
        for f in &files {
            std::fs::write(f, b"x").unwrap();
            std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let other = dir.join("notes.txt");
        std::fs::write(&other, b"not wasq's").unwrap();
        std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o644)).unwrap();

        prepare(&dir, Some(&cache)).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&cache), 0o700);
        for f in &files {
            assert_eq!(mode(f), 0o600, "{}", f.display());
        }
        assert_eq!(
            mode(&other),
            0o644,
            "files that are not wasq's are left alone"
        );
    }

    #[test]
    fn a_new_folder_is_private_and_a_world_writable_one_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        prepare(&dir, None).unwrap();
        assert_eq!(mode(&dir), 0o700);

        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = prepare(&dir, None).unwrap_err().to_string();
        assert!(err.contains("writable by other users (mode 777)"), "{err}");
        assert_eq!(mode(&dir), 0o777, "refused, not changed");
    }
}
