//! The few libvirt C calls the backend needs, loaded from `libvirt.so.0`
//! at run time.
//!
//! Written by hand on purpose: the Rust `virt` crate is LGPL-2.1 and would be
//! linked statically into an Apache-2.0 binary, and it lacks the calls this
//! backend needs most (block I/O tuning, stats with latency, a checked
//! domain state), so they would be raw FFI anyway. Loading the shared
//! library with `libloading` keeps libvirt a run-time dependency of hosts
//! that use it, and out of every other host and build.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr, CString};
use std::sync::OnceLock;

pub type ConnectPtr = *mut c_void;
pub type DomainPtr = *mut c_void;

/// `VIR_TYPED_PARAM_FIELD_LENGTH`.
const FIELD_LENGTH: usize = 80;
pub const TYPED_PARAM_LLONG: c_int = 3;
pub const TYPED_PARAM_ULLONG: c_int = 4;
pub const TYPED_PARAM_STRING: c_int = 7;

/// `virTypedParameter`: a name, a type tag and an 8-byte union.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TypedParam {
    pub field: [c_char; FIELD_LENGTH],
    pub kind: c_int,
    pub value: TypedValue,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union TypedValue {
    pub l: i64,
    pub ul: c_ulonglong,
    pub s: *mut c_char,
}

impl TypedParam {
    pub fn zeroed() -> TypedParam {
        TypedParam {
            field: [0; FIELD_LENGTH],
            kind: 0,
            value: TypedValue { ul: 0 },
        }
    }

    /// A parameter naming a field `name` (shorter than 80 bytes).
    fn named(name: &str, kind: c_int, value: TypedValue) -> TypedParam {
        let mut p = TypedParam::zeroed();
        for (dst, src) in p.field.iter_mut().zip(name.bytes().take(FIELD_LENGTH - 1)) {
            *dst = src as c_char;
        }
        p.kind = kind;
        p.value = value;
        p
    }

    pub fn ullong(name: &str, v: u64) -> TypedParam {
        TypedParam::named(name, TYPED_PARAM_ULLONG, TypedValue { ul: v })
    }

    /// A string parameter pointing into `v`, which must outlive the call.
    pub fn string(name: &str, v: &CStr) -> TypedParam {
        TypedParam::named(
            name,
            TYPED_PARAM_STRING,
            TypedValue {
                s: v.as_ptr() as *mut c_char,
            },
        )
    }

    pub fn name(&self) -> String {
        // SAFETY: libvirt NUL-terminates field names within the array, and
        // a zeroed array is an empty string.
        unsafe { CStr::from_ptr(self.field.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }
}

/// The leading fields of `virError` (the rest is not read).
#[repr(C)]
struct ErrorHead {
    code: c_int,
    domain: c_int,
    message: *const c_char,
}

/// `VIR_ERR_NO_DOMAIN`: the domain is gone (destroyed, undefined).
pub const ERR_NO_DOMAIN: c_int = 42;
/// `VIR_ERR_OPERATION_INVALID`: e.g. the domain is not running.
pub const ERR_OPERATION_INVALID: c_int = 55;
/// `VIR_FROM_RPC`: the connection to the daemon failed.
pub const FROM_RPC: c_int = 7;

/// A libvirt error: its code, the subsystem it came from, its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LvError {
    pub code: i32,
    pub domain: i32,
    pub message: String,
}

impl std::fmt::Display for LvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for LvError {}

/// Why libvirt cannot be used on this host.
///
/// Clone because [`lib`] keeps the first attempt's outcome for every later
/// call; libloading's and std's errors are not Clone, so those variants keep
/// the underlying error's message instead of the error itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    #[error("libvirt is not installed (libvirt.so.0: {message})")]
    NotInstalled { message: String },
    #[error("libvirt.so.0 lacks {symbol}: {message}")]
    MissingSymbol {
        symbol: &'static str,
        message: String,
    },
    #[error("libvirt event loop: {0}")]
    EventLoop(#[source] LvError),
    #[error("libvirt event loop thread: {message}")]
    EventThread { message: String },
}

/// A call that could not be made at all carries no libvirt code or domain.
impl From<LoadError> for LvError {
    fn from(e: LoadError) -> LvError {
        LvError {
            code: 0,
            domain: 0,
            message: e.to_string(),
        }
    }
}

macro_rules! functions {
    ($($name:ident : fn($($arg:ty),*) -> $ret:ty;)*) => {
        /// The entry points, resolved once.
        #[allow(non_snake_case)]
        pub struct Lib {
            _library: libloading::Library,
            $(pub $name: unsafe extern "C" fn($($arg),*) -> $ret,)*
        }

        impl Lib {
            #[allow(non_snake_case)]
            fn load() -> Result<Lib, LoadError> {
                // SAFETY: loading libvirt runs its constructors, which only
                // initialise the library's own state.
                let library = unsafe { libloading::Library::new("libvirt.so.0") }
                    .map_err(|e| LoadError::NotInstalled { message: e.to_string() })?;
                $(
                    // SAFETY: each symbol has the C signature declared here,
                    // as in libvirt's public headers; the library is kept
                    // alive with the pointers.
                    let $name = unsafe {
                        *library
                            .get::<unsafe extern "C" fn($($arg),*) -> $ret>(
                                concat!(stringify!($name), "\0").as_bytes(),
                            )
                            .map_err(|e| LoadError::MissingSymbol {
                                symbol: stringify!($name),
                                message: e.to_string(),
                            })?
                    };
                )*
                Ok(Lib { _library: library, $($name,)* })
            }
        }
    };
}

functions! {
    virConnectOpen: fn(*const c_char) -> ConnectPtr;
    virConnectClose: fn(ConnectPtr) -> c_int;
    virConnectIsAlive: fn(ConnectPtr) -> c_int;
    virConnectSetKeepAlive: fn(ConnectPtr, c_int, c_uint) -> c_int;
    virConnectListAllDomains: fn(ConnectPtr, *mut *mut DomainPtr, c_uint) -> c_int;
    virDomainLookupByUUIDString: fn(ConnectPtr, *const c_char) -> DomainPtr;
    virDomainFree: fn(DomainPtr) -> c_int;
    virDomainGetName: fn(DomainPtr) -> *const c_char;
    virDomainGetUUIDString: fn(DomainPtr, *mut c_char) -> c_int;
    virDomainGetState: fn(DomainPtr, *mut c_int, *mut c_int, c_uint) -> c_int;
    virDomainGetXMLDesc: fn(DomainPtr, c_uint) -> *mut c_char;
    virDomainBlockStatsFlags: fn(DomainPtr, *const c_char, *mut TypedParam, *mut c_int, c_uint) -> c_int;
    virDomainGetBlockIoTune: fn(DomainPtr, *const c_char, *mut TypedParam, *mut c_int, c_uint) -> c_int;
    virDomainSetBlockIoTune: fn(DomainPtr, *const c_char, *mut TypedParam, c_int, c_uint) -> c_int;
    virTypedParamsClear: fn(*mut TypedParam, c_int) -> ();
    virGetLastError: fn() -> *const c_void;
    virResetLastError: fn() -> ();
    virSetErrorFunc: fn(*mut c_void, Option<unsafe extern "C" fn(*mut c_void, *const c_void)>) -> ();
    virEventRegisterDefaultImpl: fn() -> c_int;
    virEventRunDefaultImpl: fn() -> c_int;
}

unsafe extern "C" fn quiet(_: *mut c_void, _: *const c_void) {}

/// libvirt, loaded on first use with its event loop running (keepalive
/// needs one: it is what notices a daemon that stopped answering). An error
/// says why it cannot be used on this host.
pub fn lib() -> Result<&'static Lib, LoadError> {
    static LIB: OnceLock<Result<Lib, LoadError>> = OnceLock::new();
    LIB.get_or_init(|| {
        let lib = Lib::load()?;
        // SAFETY: plain calls with valid arguments; the event loop thread
        // only runs libvirt's own loop.
        unsafe {
            // Errors are returned to the caller; libvirt's default is to
            // also print each to stderr.
            (lib.virSetErrorFunc)(std::ptr::null_mut(), Some(quiet));
            if (lib.virEventRegisterDefaultImpl)() < 0 {
                return Err(LoadError::EventLoop(last_error_of(&lib)));
            }
        }
        let run = lib.virEventRunDefaultImpl;
        std::thread::Builder::new()
            .name("libvirt-events".into())
            .spawn(move || loop {
                // SAFETY: registered above; runs one iteration of the loop.
                if unsafe { run() } < 0 {
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
            })
            .map_err(|e| LoadError::EventThread {
                message: e.to_string(),
            })?;
        Ok(lib)
    })
    .as_ref()
    .map_err(Clone::clone)
}

fn last_error_of(lib: &Lib) -> LvError {
    // SAFETY: virGetLastError returns this thread's last error or null; the
    // fields read are the leading ones of virError.
    unsafe {
        let e = (lib.virGetLastError)() as *const ErrorHead;
        if e.is_null() {
            return LvError {
                code: 0,
                domain: 0,
                message: "libvirt failed without saying why".into(),
            };
        }
        let message = if (*e).message.is_null() {
            String::new()
        } else {
            CStr::from_ptr((*e).message).to_string_lossy().into_owned()
        };
        let out = LvError {
            code: (*e).code,
            domain: (*e).domain,
            message,
        };
        (lib.virResetLastError)();
        out
    }
}

/// An open connection, closed on drop.
pub struct Connection(ConnectPtr);

/// A domain handle, freed on drop.
pub struct Domain(DomainPtr);

fn c_string(s: &str) -> Result<CString, LvError> {
    CString::new(s).map_err(|_| LvError {
        code: 0,
        domain: 0,
        message: format!("`{}` contains a NUL byte", s.escape_debug()),
    })
}

impl Connection {
    pub fn open(uri: &str) -> Result<Connection, LvError> {
        let lib = loaded()?;
        let uri = c_string(uri)?;
        // SAFETY: uri is a valid C string for the call.
        let ptr = unsafe { (lib.virConnectOpen)(uri.as_ptr()) };
        if ptr.is_null() {
            return Err(last_error_of(lib));
        }
        let conn = Connection(ptr);
        // A probe every second, and the connection closed after two
        // unanswered: a hung daemon costs a call about 3 s, not forever.
        // SAFETY: a live connection.
        if unsafe { (lib.virConnectSetKeepAlive)(conn.0, 1, 2) } < 0 {
            return Err(last_error_of(lib));
        }
        Ok(conn)
    }

    pub fn is_alive(&self) -> bool {
        // SAFETY: a live connection handle.
        lib().is_ok_and(|lib| unsafe { (lib.virConnectIsAlive)(self.0) } == 1)
    }

    /// Active domains (running or paused).
    pub fn active_domains(&self) -> Result<Vec<Domain>, LvError> {
        let lib = loaded()?;
        const ACTIVE: c_uint = 1; // VIR_CONNECT_LIST_DOMAINS_ACTIVE
        let mut list: *mut DomainPtr = std::ptr::null_mut();
        // SAFETY: libvirt allocates the array; each handle and the array
        // are freed below (handles by Domain's drop).
        let n = unsafe { (lib.virConnectListAllDomains)(self.0, &mut list, ACTIVE) };
        if n < 0 {
            return Err(last_error_of(lib));
        }
        let mut out = Vec::with_capacity(n as usize);
        for i in 0..n as usize {
            // SAFETY: the array holds n handles.
            out.push(Domain(unsafe { *list.add(i) }));
        }
        // SAFETY: the array itself, malloc'd by libvirt ("the caller must
        // free" it).
        unsafe { libc::free(list as *mut c_void) };
        Ok(out)
    }

    pub fn domain_by_uuid(&self, uuid: &str) -> Result<Domain, LvError> {
        let lib = loaded()?;
        let uuid = c_string(uuid)?;
        // SAFETY: valid connection and C string.
        let ptr = unsafe { (lib.virDomainLookupByUUIDString)(self.0, uuid.as_ptr()) };
        if ptr.is_null() {
            return Err(last_error_of(lib));
        }
        Ok(Domain(ptr))
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let Ok(lib) = lib() {
            // SAFETY: closed once, here.
            unsafe { (lib.virConnectClose)(self.0) };
        }
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        if let Ok(lib) = lib() {
            // SAFETY: freed once, here.
            unsafe { (lib.virDomainFree)(self.0) };
        }
    }
}

/// [`lib`] for the calls that answer with an [`LvError`].
fn loaded() -> Result<&'static Lib, LvError> {
    Ok(lib()?)
}

impl Domain {
    pub fn name(&self) -> Result<String, LvError> {
        let lib = loaded()?;
        // SAFETY: the name belongs to the handle and is copied out at once.
        let p = unsafe { (lib.virDomainGetName)(self.0) };
        if p.is_null() {
            return Err(last_error_of(lib));
        }
        // SAFETY: a NUL-terminated string owned by the handle.
        Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    pub fn uuid(&self) -> Result<String, LvError> {
        let lib = loaded()?;
        let mut buf = [0 as c_char; 37]; // VIR_UUID_STRING_BUFLEN
                                         // SAFETY: the buffer is VIR_UUID_STRING_BUFLEN long.
        if unsafe { (lib.virDomainGetUUIDString)(self.0, buf.as_mut_ptr()) } < 0 {
            return Err(last_error_of(lib));
        }
        // SAFETY: libvirt NUL-terminates it.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// `virDomainState`: 1 running, 2 blocked, 3 paused, 4 shutting down,
    /// 5 shut off, 6 crashed, 7 suspended by the guest.
    pub fn state(&self) -> Result<i32, LvError> {
        let lib = loaded()?;
        let (mut state, mut reason): (c_int, c_int) = (0, 0);
        // SAFETY: two valid out-pointers.
        if unsafe { (lib.virDomainGetState)(self.0, &mut state, &mut reason, 0) } < 0 {
            return Err(last_error_of(lib));
        }
        Ok(state)
    }

    /// The live XML description.
    pub fn xml(&self) -> Result<String, LvError> {
        let lib = loaded()?;
        // SAFETY: libvirt returns a malloc'd string, freed below.
        let p = unsafe { (lib.virDomainGetXMLDesc)(self.0, 0) };
        if p.is_null() {
            return Err(last_error_of(lib));
        }
        // SAFETY: NUL-terminated; copied, then freed once.
        let text = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
        unsafe { libc::free(p as *mut c_void) };
        Ok(text)
    }

    /// Reads typed parameters with libvirt's two-call protocol (count,
    /// then values). Strings are copied out and freed.
    fn typed_params(
        &self,
        call: unsafe extern "C" fn(
            DomainPtr,
            *const c_char,
            *mut TypedParam,
            *mut c_int,
            c_uint,
        ) -> c_int,
        disk: &str,
    ) -> Result<Vec<(String, ParamValue)>, LvError> {
        let lib = loaded()?;
        let disk = c_string(disk)?;
        let mut n: c_int = 0;
        // SAFETY: a null array with n = 0 asks for the count.
        if unsafe { call(self.0, disk.as_ptr(), std::ptr::null_mut(), &mut n, 0) } < 0 {
            return Err(last_error_of(lib));
        }
        let mut params = vec![TypedParam::zeroed(); n.max(0) as usize];
        // SAFETY: room for n parameters.
        if unsafe { call(self.0, disk.as_ptr(), params.as_mut_ptr(), &mut n, 0) } < 0 {
            return Err(last_error_of(lib));
        }
        let n = (n.max(0) as usize).min(params.len());
        let out = params[..n]
            .iter()
            .map(|p| {
                // SAFETY: the tag says which union member libvirt wrote.
                let v = unsafe {
                    match p.kind {
                        TYPED_PARAM_LLONG => ParamValue::Int(p.value.l.max(0) as u64),
                        TYPED_PARAM_ULLONG => ParamValue::Int(p.value.ul),
                        TYPED_PARAM_STRING if !p.value.s.is_null() => ParamValue::Text(
                            CStr::from_ptr(p.value.s).to_string_lossy().into_owned(),
                        ),
                        TYPED_PARAM_STRING => ParamValue::Text(String::new()),
                        _ => ParamValue::Other,
                    }
                };
                (p.name(), v)
            })
            .collect();
        // SAFETY: frees the strings libvirt allocated, not the array.
        unsafe { (lib.virTypedParamsClear)(params.as_mut_ptr(), n as c_int) };
        Ok(out)
    }

    /// `virDomainBlockStatsFlags`: counters and total times of one disk.
    pub fn block_stats(&self, disk: &str) -> Result<Vec<(String, ParamValue)>, LvError> {
        self.typed_params(loaded()?.virDomainBlockStatsFlags, disk)
    }

    /// `virDomainGetBlockIoTune` of the running domain.
    pub fn block_io_tune(&self, disk: &str) -> Result<Vec<(String, ParamValue)>, LvError> {
        self.typed_params(loaded()?.virDomainGetBlockIoTune, disk)
    }

    /// `virDomainSetBlockIoTune` on the running domain (`VIR_DOMAIN_AFFECT_LIVE`).
    pub fn set_block_io_tune(&self, disk: &str, params: &mut [TypedParam]) -> Result<(), LvError> {
        let lib = loaded()?;
        let disk = c_string(disk)?;
        const AFFECT_LIVE: c_uint = 1;
        // SAFETY: params are valid for the call (strings point into
        // CStrings the caller keeps alive).
        let rc = unsafe {
            (lib.virDomainSetBlockIoTune)(
                self.0,
                disk.as_ptr(),
                params.as_mut_ptr(),
                params.len() as c_int,
                AFFECT_LIVE,
            )
        };
        if rc < 0 {
            return Err(last_error_of(lib));
        }
        Ok(())
    }
}

/// A typed parameter's value as the backend uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParamValue {
    Int(u64),
    Text(String),
    Other,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typed_parameter_is_laid_out_as_libvirts() {
        // 80 bytes of name, an int tag, padding, an 8-byte union.
        assert_eq!(std::mem::size_of::<TypedParam>(), 96);
        assert_eq!(std::mem::align_of::<TypedParam>(), 8);
        let p = TypedParam::ullong("total_iops_sec", 200);
        assert_eq!(p.name(), "total_iops_sec");
        assert_eq!(p.kind, TYPED_PARAM_ULLONG);
        assert_eq!(unsafe { p.value.ul }, 200);
    }
}
