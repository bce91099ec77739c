//! A disk that goes away under the SQLite store: while a given file exists,
//! every read, write, sync and lock that SQLite asks of any file of this
//! process fails with an I/O error, on handles already open, as on a network
//! volume that dropped (Azure Files under a Functions app, an NFS mount).
//!
//! The chaos run's SQLite outage, the counterpart of cutting every
//! SQL Server connection: the writer meets the error on its open handle
//! rather than a lock it can wait out, and must serve again on the same
//! handle once the disk is back. Built only with `--features failpoints`.
//!
//! How: a VFS that wraps SQLite's default one (`unix`), registered as the
//! default (every connection the process opens afterwards goes through it)
//! or only by name, [`NAME`], for a test among others in one process. Each file it opens is the default VFS's file, preceded by a
//! header whose methods check the switch and forward. Releasing (unlock,
//! close, unmap) always goes through: a lock is never left held by a
//! refused release, as the kernel would drop it with the handle anyway.
//! Not faulted: file controls (a size hint may write when a chunk size is
//! set, which the store does not), sector size and device characteristics.
//!
//! What a real disk may do and this one does too: a commit whose frames
//! were written before the disk went and whose sync then failed is
//! answered as failed, yet its frames are in the WAL, and a later
//! recovery (every connection closed, then one opened) may find it
//! committed. The store's calls are idempotent, so it is harmless for
//! them; it is why a failed commit is `retry`, never "not done".

use std::ffi::{c_int, c_void};
use std::mem::size_of;
use std::path::PathBuf;
use std::ptr;
use std::sync::OnceLock;

use rusqlite::ffi;

/// The file whose existence means "the disk is away".
static SWITCH: OnceLock<PathBuf> = OnceLock::new();
/// SQLite's default VFS, which does the real work (a `*mut sqlite3_vfs`).
static BASE: OnceLock<usize> = OnceLock::new();

/// The VFS's name, for a connection that asks for it by name
/// (`Connection::open_with_flags_and_vfs`) when it is not the default.
pub const NAME: &str = "order-guard-disk-fault";
const C_NAME: &std::ffi::CStr = c"order-guard-disk-fault";

/// Register the VFS: from now on, while `switch` exists, every file
/// operation through it fails. `as_default`: every connection the process
/// opens afterwards goes through it (the handlers under chaos); otherwise
/// only those that ask for [`NAME`] (a test beside others in one process).
/// Once per process (a second call is refused).
pub fn arm(switch: PathBuf, as_default: bool) -> Result<(), String> {
    SWITCH
        .set(switch)
        .map_err(|_| "the disk fault is armed already".to_string())?;
    // SAFETY: `sqlite3_vfs_find` initialises SQLite if needed; the default
    // VFS lives as long as the process. The copy is leaked, so it does too,
    // as SQLite needs of a registered VFS. Every method but `xOpen` is the
    // default VFS's own, given its `pAppData` (copied with it); unix's
    // ignore the VFS pointer they are passed.
    unsafe {
        let base = ffi::sqlite3_vfs_find(ptr::null());
        if base.is_null() {
            return Err("SQLite has no default VFS".into());
        }
        let mut vfs: ffi::sqlite3_vfs = ptr::read(base);
        debug_assert_eq!(C_NAME.to_str(), Ok(NAME));
        vfs.zName = C_NAME.as_ptr();
        vfs.szOsFile = HEADER + (*base).szOsFile;
        vfs.pNext = ptr::null_mut();
        vfs.xOpen = Some(open);
        BASE.get_or_init(|| base as usize);
        let rc = ffi::sqlite3_vfs_register(Box::leak(Box::new(vfs)), c_int::from(as_default));
        if rc != ffi::SQLITE_OK {
            return Err(format!("sqlite3_vfs_register failed ({rc})"));
        }
    }
    Ok(())
}

/// Whether the disk is away now: one `stat` per call, a fault point's cost.
fn away() -> bool {
    SWITCH.get().is_some_and(|switch| switch.exists())
}

/// What SQLite allocates for each file of this VFS: this header, then the
/// default VFS's own file object.
#[repr(C)]
struct Wrapped {
    /// SQLite's view: `pMethods` is [`METHODS`] once the file is open.
    file: ffi::sqlite3_file,
    /// The default VFS's file object, just past this header.
    inner: *mut ffi::sqlite3_file,
}

/// The header's size, a multiple of 8 so the inner file stays aligned.
const HEADER: c_int = size_of::<Wrapped>().next_multiple_of(8) as c_int;

fn base() -> *mut ffi::sqlite3_vfs {
    *BASE.get().expect("the disk fault is armed") as *mut ffi::sqlite3_vfs
}

/// The default VFS's methods of an open file (unix gives every file a
/// whole version-3 table; only the database file's has shared memory,
/// and SQLite asks for it on no other).
///
/// # Safety
/// `file` is a [`Wrapped`] this VFS opened successfully.
unsafe fn inner(file: *mut ffi::sqlite3_file) -> (*mut ffi::sqlite3_file, ffi::sqlite3_io_methods) {
    let inner = (*file.cast::<Wrapped>()).inner;
    (inner, *(*inner).pMethods)
}

/// Forward `$method` to the default VFS's file, or fail with `$error` while
/// the disk is away.
macro_rules! forward {
    ($file:ident, $method:ident ( $($arg:expr),* ), away => $error:expr) => {{
        if away() {
            return $error;
        }
        forward!($file, $method($($arg),*))
    }};
    ($file:ident, $method:ident ( $($arg:expr),* )) => {{
        let (inner, methods) = inner($file);
        match methods.$method {
            Some(method) => method(inner $(, $arg)*),
            None => ffi::SQLITE_IOERR,
        }
    }};
}

unsafe extern "C" fn open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let wrapped = file.cast::<Wrapped>();
    let inner = file
        .cast::<u8>()
        .add(HEADER as usize)
        .cast::<ffi::sqlite3_file>();
    (*wrapped).file.pMethods = ptr::null();
    (*wrapped).inner = inner;
    (*inner).pMethods = ptr::null();
    // Opening goes through: a handler restarted during the outage starts,
    // and meets the fault at its first read, as on a volume that hangs.
    let base = base();
    let rc = match (*base).xOpen {
        Some(open) => open(base, name, inner, flags, out_flags),
        None => ffi::SQLITE_CANTOPEN,
    };
    if rc == ffi::SQLITE_OK {
        (*wrapped).file.pMethods = &METHODS;
    } else if !(*inner).pMethods.is_null() {
        // SQLite closes a file whose open failed only through the methods
        // it was given, which were none: close the inner one here.
        if let Some(close) = (*(*inner).pMethods).xClose {
            close(inner);
        }
    }
    rc
}

unsafe extern "C" fn close(file: *mut ffi::sqlite3_file) -> c_int {
    forward!(file, xClose())
}

unsafe extern "C" fn read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    n: c_int,
    at: i64,
) -> c_int {
    forward!(file, xRead(buf, n, at), away => ffi::SQLITE_IOERR_READ)
}

unsafe extern "C" fn write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    n: c_int,
    at: i64,
) -> c_int {
    forward!(file, xWrite(buf, n, at), away => ffi::SQLITE_IOERR_WRITE)
}

unsafe extern "C" fn truncate(file: *mut ffi::sqlite3_file, size: i64) -> c_int {
    forward!(file, xTruncate(size), away => ffi::SQLITE_IOERR_TRUNCATE)
}

unsafe extern "C" fn sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    forward!(file, xSync(flags), away => ffi::SQLITE_IOERR_FSYNC)
}

unsafe extern "C" fn file_size(file: *mut ffi::sqlite3_file, size: *mut i64) -> c_int {
    forward!(file, xFileSize(size), away => ffi::SQLITE_IOERR_FSTAT)
}

unsafe extern "C" fn lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    forward!(file, xLock(level), away => ffi::SQLITE_IOERR_LOCK)
}

unsafe extern "C" fn unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    forward!(file, xUnlock(level))
}

unsafe extern "C" fn check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    forward!(file, xCheckReservedLock(out), away => ffi::SQLITE_IOERR_CHECKRESERVEDLOCK)
}

unsafe extern "C" fn file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    forward!(file, xFileControl(op, arg))
}

unsafe extern "C" fn sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    let (inner, methods) = inner(file);
    methods.xSectorSize.map_or(4096, |method| method(inner))
}

unsafe extern "C" fn device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    let (inner, methods) = inner(file);
    methods
        .xDeviceCharacteristics
        .map_or(0, |method| method(inner))
}

unsafe extern "C" fn shm_map(
    file: *mut ffi::sqlite3_file,
    page: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    forward!(file, xShmMap(page, size, extend, out), away => ffi::SQLITE_IOERR_SHMMAP)
}

unsafe extern "C" fn shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    // The WAL index is shared memory: its reads and writes never reach the
    // VFS, but every transaction takes its locks here.
    if flags & ffi::SQLITE_SHM_LOCK != 0 && away() {
        return ffi::SQLITE_IOERR_SHMLOCK;
    }
    forward!(file, xShmLock(offset, n, flags))
}

unsafe extern "C" fn shm_barrier(file: *mut ffi::sqlite3_file) {
    let (inner, methods) = inner(file);
    if let Some(method) = methods.xShmBarrier {
        method(inner);
    }
}

unsafe extern "C" fn shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    forward!(file, xShmUnmap(delete))
}

unsafe extern "C" fn fetch(
    file: *mut ffi::sqlite3_file,
    at: i64,
    n: c_int,
    out: *mut *mut c_void,
) -> c_int {
    if away() {
        // No memory-mapped page: SQLite falls back to `xRead`, which fails.
        *out = ptr::null_mut();
        return ffi::SQLITE_OK;
    }
    forward!(file, xFetch(at, n, out))
}

unsafe extern "C" fn unfetch(file: *mut ffi::sqlite3_file, at: i64, page: *mut c_void) -> c_int {
    forward!(file, xUnfetch(at, page))
}

static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(close),
    xRead: Some(read),
    xWrite: Some(write),
    xTruncate: Some(truncate),
    xSync: Some(sync),
    xFileSize: Some(file_size),
    xLock: Some(lock),
    xUnlock: Some(unlock),
    xCheckReservedLock: Some(check_reserved_lock),
    xFileControl: Some(file_control),
    xSectorSize: Some(sector_size),
    xDeviceCharacteristics: Some(device_characteristics),
    xShmMap: Some(shm_map),
    xShmLock: Some(shm_lock),
    xShmBarrier: Some(shm_barrier),
    xShmUnmap: Some(shm_unmap),
    xFetch: Some(fetch),
    xUnfetch: Some(unfetch),
};
