//! Files as a process that may run as root must treat them: whoever can name a path may be
//! hostile. Files sluice reads (keys, certificates, captures) must be regular files of a
//! bounded size, opened without blocking (a FIFO does not hang the reader); folders and files
//! it writes are made by it, 0700 and 0600, created exclusively and reached through the
//! descriptor of their folder, with no symbolic link followed on the way.

use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

/// Reads the regular file at `path`, of at most `max` bytes. A FIFO, a device, a folder or a
/// larger file is refused without being read (it is opened non-blocking, so a FIFO with no
/// writer does not hang the caller).
pub fn read_regular(path: &Path, max: u64) -> Result<Vec<u8>, PathError> {
    let at = PathError::at(path);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| at(Problem::Io(e)))?;
    let meta = file.metadata().map_err(|e| at(Problem::Io(e)))?;
    if !meta.is_file() {
        return Err(at(Problem::NotRegular));
    }
    if meta.len() > max {
        return Err(at(Problem::TooLarge { len: meta.len(), max }));
    }
    let mut out = Vec::with_capacity(meta.len() as usize);
    file.take(max + 1).read_to_end(&mut out).map_err(|e| at(Problem::Io(e)))?;
    if out.len() as u64 > max {
        return Err(at(Problem::Grew { max }));
    }
    Ok(out)
}

/// A file or folder sluice was given (by its configuration, its operator or an API caller)
/// that it cannot use, and why: the fault of whoever named it, or of the host.
#[derive(Debug, thiserror::Error)]
#[error("{}: {problem}", path.display())]
pub struct PathError {
    pub path: PathBuf,
    pub problem: Problem,
}

/// What is wrong with a path ([`PathError`]).
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("not a regular file")]
    NotRegular,
    #[error("{len} bytes: larger than the {max} bytes allowed")]
    TooLarge { len: u64, max: u64 },
    #[error("grew past the {max} bytes allowed while read")]
    Grew { max: u64 },
    #[error("a NUL byte in the path")]
    NulByte,
    #[error("an unexpected part in the path")]
    UnexpectedPart,
    #[error("exists already: a capture goes to a new folder")]
    Exists,
}

impl PathError {
    /// Errors about `path`.
    pub fn at(path: &Path) -> impl Fn(Problem) -> PathError + '_ {
        move |problem| PathError { path: path.to_path_buf(), problem }
    }
}

/// A folder sluice writes into, held by its descriptor: what is made in it stays in it even if
/// its path is renamed or replaced meanwhile.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

impl Dir {
    /// Opens the folder at `path`, making it (0700) when it is missing and `create` is set.
    /// No component of the path may be a symbolic link; the folder must be this process's
    /// user's and not writable by its group or others.
    pub fn open(path: &Path, create: bool) -> Result<Dir, PathError> {
        let dir = Dir::open_shared(path, create)?;
        check_private(&dir.fd).map_err(|e| PathError::at(path)(Problem::Io(e)))?;
        Ok(dir)
    }

    /// As [`Dir::open`], for a folder others may own or write in (what is made in it is
    /// checked, not it).
    pub fn open_shared(path: &Path, create: bool) -> Result<Dir, PathError> {
        let at = PathError::at(path);
        let (mut fd, rest) = start(path).map_err(|e| at(Problem::Io(e)))?;
        let parts: Vec<_> = rest.components().collect();
        for (i, c) in parts.iter().enumerate() {
            let name = match c {
                Component::Normal(n) => CString::new(n.as_bytes()).map_err(|_| at(Problem::NulByte))?,
                Component::CurDir => continue,
                Component::ParentDir => c"..".to_owned(),
                _ => return Err(at(Problem::UnexpectedPart)),
            };
            let last = i + 1 == parts.len();
            if last && create {
                // SAFETY: mkdirat reads the descriptor and the NUL-terminated name.
                let r = unsafe { libc::mkdirat(fd.as_raw_fd(), name.as_ptr(), 0o700) };
                let e = std::io::Error::last_os_error();
                if r != 0 && e.raw_os_error() != Some(libc::EEXIST) {
                    return Err(at(Problem::Io(e)));
                }
            }
            fd = open_dir_at(&fd, &name).map_err(|e| at(Problem::Io(e)))?;
        }
        // Shown as absolute (the working folder's path, read once, is only for messages).
        let shown = if path.is_absolute() { path.to_path_buf() } else { std::env::current_dir().unwrap_or_default().join(path) };
        Ok(Dir { fd, path: shown })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes the new folder `name` (0700) in this one and opens it. It must not exist.
    pub fn make_child(&self, name: &str) -> Result<Dir, PathError> {
        let path = self.path.join(name);
        let at = PathError::at(&path);
        let c = plain_name(name).map_err(|e| at(Problem::Io(e)))?;
        // SAFETY: mkdirat reads the descriptor and the NUL-terminated name.
        if unsafe { libc::mkdirat(self.fd.as_raw_fd(), c.as_ptr(), 0o700) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EEXIST) {
                return Err(at(Problem::Exists));
            }
            return Err(at(Problem::Io(e)));
        }
        let fd = open_dir_at(&self.fd, &c).map_err(|e| at(Problem::Io(e)))?;
        check_private(&fd).map_err(|e| at(Problem::Io(e)))?;
        drop(at);
        Ok(Dir { fd, path })
    }

    /// Creates the new file `name` (0600) for writing; it must not exist (not even as a
    /// symbolic link).
    pub fn create_file(&self, name: &str) -> std::io::Result<File> {
        let c = plain_name(name)?;
        let flags = libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_WRONLY | libc::O_CLOEXEC;
        // SAFETY: openat reads the descriptor and the NUL-terminated name; a descriptor it
        // returns is new and ours.
        let fd = unsafe { libc::openat(self.fd.as_raw_fd(), c.as_ptr(), flags, 0o600 as libc::c_uint) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd was just returned by openat and nothing else owns it.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// Replaces the file `name` with `bytes` at once (a reader sees the old or the new one):
    /// written to `name.tmp`, made anew, then renamed over it.
    pub fn replace_file(&self, name: &str, bytes: &[u8]) -> std::io::Result<()> {
        let tmp = format!("{name}.tmp");
        let (ctmp, cname) = (plain_name(&tmp)?, plain_name(name)?);
        // SAFETY: unlinkat reads the descriptor and the name; it removes a link, never follows one.
        unsafe { libc::unlinkat(self.fd.as_raw_fd(), ctmp.as_ptr(), 0) };
        let mut f = self.create_file(&tmp)?;
        f.write_all(bytes)?;
        f.sync_data()?;
        // SAFETY: renameat reads the descriptors and names; a link named `name` is replaced,
        // not followed.
        if unsafe { libc::renameat(self.fd.as_raw_fd(), ctmp.as_ptr(), self.fd.as_raw_fd(), cname.as_ptr()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// A name of one path component: no `/`, no NUL, not `.` or `..`.
fn plain_name(name: &str) -> std::io::Result<CString> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{name:?} is not a plain file name")));
    }
    CString::new(name).map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a NUL byte in a file name"))
}

/// The folder a path starts from (`/` or the working folder), and the rest of the path.
fn start(path: &Path) -> std::io::Result<(OwnedFd, &Path)> {
    let (from, rest) = match path.strip_prefix("/") {
        Ok(rest) => (c"/", rest),
        Err(_) => (c".", path),
    };
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    // SAFETY: open reads the NUL-terminated path; a descriptor it returns is new and ours.
    let fd = unsafe { libc::open(from.as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by open and nothing else owns it.
    Ok((unsafe { OwnedFd::from_raw_fd(fd) }, rest))
}

/// Opens the folder `name` in `dir`, refusing a symbolic link.
fn open_dir_at(dir: &OwnedFd, name: &CString) -> std::io::Result<OwnedFd> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
    // SAFETY: openat reads the descriptor and the NUL-terminated name; a descriptor it returns
    // is new and ours.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        let shown = name.to_string_lossy();
        return Err(if is_link_at(dir, name) {
            std::io::Error::other(format!("{shown} is a symbolic link"))
        } else {
            std::io::Error::new(e.kind(), format!("{shown}: {e}"))
        });
    }
    // SAFETY: fd was just returned by openat and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether `name` in `dir` is a symbolic link.
fn is_link_at(dir: &OwnedFd, name: &CString) -> bool {
    // SAFETY: fstatat writes only the stat it is given; the descriptor and name are read.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstatat(dir.as_raw_fd(), name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFLNK
    }
}

/// The folder must be this process's user's and not writable by its group or others.
fn check_private(fd: &OwnedFd) -> std::io::Result<()> {
    let meta = File::from(fd.try_clone()?).metadata()?;
    // SAFETY: geteuid has no arguments and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(std::io::Error::other(format!("owned by user {}, not by sluice's ({me})", meta.uid())));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(std::io::Error::other(format!("others may write in it (mode {:o})", meta.mode() & 0o777)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sluice-sys-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    }

    #[test]
    fn only_regular_files_of_bounded_size_are_read() {
        let d = scratch("read");
        std::fs::write(d.join("small"), b"0123456789").unwrap();
        assert_eq!(read_regular(&d.join("small"), 10).unwrap(), b"0123456789");
        assert!(read_regular(&d.join("small"), 9).unwrap_err().to_string().contains("larger than"));
        let fifo = CString::new(d.join("fifo").as_os_str().as_bytes()).unwrap();
        // SAFETY: mkfifo reads the NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert!(read_regular(&d.join("fifo"), 100).unwrap_err().to_string().contains("not a regular file"));
        assert!(read_regular(Path::new("/dev/zero"), 100).unwrap_err().to_string().contains("not a regular file"));
        assert!(read_regular(&d, 100).unwrap_err().to_string().contains("not a regular file"));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn folders_are_private_made_anew_and_reached_without_links() {
        let d = scratch("dir");
        let root = Dir::open(&d.join("root"), true).unwrap();
        let mode = std::fs::metadata(d.join("root")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        let cap = root.make_child("one").unwrap();
        assert!(root.make_child("one").unwrap_err().to_string().contains("exists already"));
        assert!(root.make_child("..").is_err());
        assert!(root.make_child("a/b").is_err());
        // A link planted where a file is made is never followed.
        let victim = d.join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, d.join("root/one/meta.json.tmp")).unwrap();
        cap.replace_file("meta.json", b"{}").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert_eq!(std::fs::read(d.join("root/one/meta.json")).unwrap(), b"{}");
        let mode = std::fs::metadata(d.join("root/one/meta.json")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::os::unix::fs::symlink(&victim, d.join("root/one/w00.cap")).unwrap();
        assert!(cap.create_file("w00.cap").is_err());
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        // A link anywhere on the path, or a folder others may write, is refused.
        std::os::unix::fs::symlink(d.join("root"), d.join("link")).unwrap();
        assert!(Dir::open(&d.join("link"), true).unwrap_err().to_string().contains("symbolic link"));
        assert!(Dir::open(&d.join("link/one"), false).unwrap_err().to_string().contains("symbolic link"));
        std::fs::create_dir(d.join("open")).unwrap();
        std::fs::set_permissions(d.join("open"), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(Dir::open(&d.join("open"), true).unwrap_err().to_string().contains("others may write"));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
