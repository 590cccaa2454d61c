//! libpq, PostgreSQL's own client library (Debian's `libpq5`), driven without blocking: every
//! wait is on the socket and this process's latch together, as PostgreSQL's walreceiver and dblink
//! wait, so that the lease worker answers signals at once even while a host never answers. This
//! module owns the libpq FFI; nothing else calls it.

use crate::registry::Failure;
use pgrx::pg_sys;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr::{self, NonNull};
use std::time::Instant;

#[repr(C)]
struct PGconn {
    _private: [u8; 0],
}

#[repr(C)]
struct PGresult {
    _private: [u8; 0],
}

#[repr(C)]
struct PQconninfoOption {
    keyword: *mut c_char,
    envvar: *mut c_char,
    compiled: *mut c_char,
    val: *mut c_char,
    label: *mut c_char,
    dispchar: *mut c_char,
    dispsize: c_int,
}

type NoticeReceiver = extern "C" fn(arg: *mut c_void, result: *const PGresult);

// From libpq-fe.h of PostgreSQL 15; libpq keeps these stable across majors.
const CONNECTION_BAD: c_int = 1;
const PGRES_POLLING_READING: c_int = 1;
const PGRES_POLLING_WRITING: c_int = 2;
const PGRES_POLLING_OK: c_int = 3;
const PGRES_COMMAND_OK: c_int = 1;
const PGRES_TUPLES_OK: c_int = 2;
const PG_DIAG_SEVERITY_NONLOCALIZED: c_int = b'V' as c_int;
const PG_DIAG_SQLSTATE: c_int = b'C' as c_int;
const PG_DIAG_MESSAGE_PRIMARY: c_int = b'M' as c_int;

#[link(name = "pq")]
extern "C" {
    fn PQconninfoParse(conninfo: *const c_char, errmsg: *mut *mut c_char) -> *mut PQconninfoOption;
    fn PQconninfoFree(options: *mut PQconninfoOption);
    fn PQconninfo(conn: *mut PGconn) -> *mut PQconninfoOption;
    fn PQfreemem(pointer: *mut c_void);
    fn PQconnectStartParams(
        keywords: *const *const c_char,
        values: *const *const c_char,
        expand_dbname: c_int,
    ) -> *mut PGconn;
    fn PQconnectPoll(conn: *mut PGconn) -> c_int;
    fn PQstatus(conn: *const PGconn) -> c_int;
    fn PQsocket(conn: *const PGconn) -> c_int;
    fn PQerrorMessage(conn: *const PGconn) -> *const c_char;
    fn PQfinish(conn: *mut PGconn);
    fn PQsetNoticeReceiver(
        conn: *mut PGconn,
        receiver: NoticeReceiver,
        arg: *mut c_void,
    ) -> Option<NoticeReceiver>;
    fn PQsetnonblocking(conn: *mut PGconn, arg: c_int) -> c_int;
    fn PQsendQueryParams(
        conn: *mut PGconn,
        command: *const c_char,
        n_params: c_int,
        param_types: *const pg_sys::Oid,
        param_values: *const *const c_char,
        param_lengths: *const c_int,
        param_formats: *const c_int,
        result_format: c_int,
    ) -> c_int;
    fn PQflush(conn: *mut PGconn) -> c_int;
    fn PQconsumeInput(conn: *mut PGconn) -> c_int;
    fn PQisBusy(conn: *mut PGconn) -> c_int;
    fn PQgetResult(conn: *mut PGconn) -> *mut PGresult;
    fn PQresultStatus(result: *const PGresult) -> c_int;
    fn PQresultErrorField(result: *const PGresult, field: c_int) -> *const c_char;
    fn PQntuples(result: *const PGresult) -> c_int;
    fn PQnfields(result: *const PGresult) -> c_int;
    fn PQgetisnull(result: *const PGresult, row: c_int, field: c_int) -> c_int;
    fn PQgetvalue(result: *const PGresult, row: c_int, field: c_int) -> *const c_char;
    fn PQclear(result: *mut PGresult);
}

/// The options a connection string sets explicitly, in libpq's names; `None` when libpq cannot
/// parse it. libpq's own message is not returned: it may quote part of the string, password
/// included.
pub fn parse(conninfo: &str) -> Option<Vec<(String, String)>> {
    let conninfo = CString::new(conninfo).ok()?;
    let mut message = ptr::null_mut();
    // SAFETY: `conninfo` is NUL-terminated and outlives the call; libpq returns either an array
    // it allocated, ended by an entry with a NULL keyword, or NULL and maybe a message it
    // allocated. Both are freed here with libpq's own functions, once, after their last use.
    unsafe {
        let options = PQconninfoParse(conninfo.as_ptr(), &mut message);
        if !message.is_null() {
            PQfreemem(message.cast());
        }
        (!options.is_null()).then(|| options_set(options))
    }
}

/// The options of libpq's array that have a value, in libpq's names; frees the array.
///
/// # Safety
///
/// `options` is a non-NULL array that libpq allocated, ended by an entry with a NULL keyword, not
/// used after this call.
unsafe fn options_set(options: *mut PQconninfoOption) -> Vec<(String, String)> {
    let mut set = vec![];
    let mut option = options;
    while !(*option).keyword.is_null() {
        if !(*option).val.is_null() {
            set.push((string_of((*option).keyword), string_of((*option).val)));
        }
        option = option.add(1);
    }
    PQconninfoFree(options);
    set
}

/// An open connection, closed when dropped.
pub struct Connection {
    conn: NonNull<PGconn>,
    /// The last WARNING the server sent; boxed so that libpq's notice receiver can keep its
    /// address.
    warning: Box<RefCell<Option<String>>>,
}

impl Connection {
    /// Connects with `params` (libpq's keywords and values), giving up at `deadline` or as soon as
    /// `stop` returns true, which is asked whenever the latch is set. `vet` is shown the options
    /// as libpq took them (service file and environment applied) before a password or a query is
    /// sent, and may refuse them.
    pub fn open(
        params: &[(String, String)],
        deadline: Instant,
        stop: &mut dyn FnMut() -> bool,
        vet: &mut dyn FnMut(&[(String, String)]) -> Result<(), Failure>,
    ) -> Result<Connection, Failure> {
        let keywords: Vec<CString> = params.iter().map(|(key, _)| c_string(key)).collect();
        let values: Vec<CString> = params.iter().map(|(_, value)| c_string(value)).collect();
        let mut keyword_ptrs: Vec<*const c_char> = keywords.iter().map(|k| k.as_ptr()).collect();
        let mut value_ptrs: Vec<*const c_char> = values.iter().map(|v| v.as_ptr()).collect();
        keyword_ptrs.push(ptr::null());
        value_ptrs.push(ptr::null());
        // SAFETY: both arrays are NULL-terminated, as long as each other, and point into strings
        // that live until the end of this function; libpq copies what it keeps.
        let conn = unsafe { PQconnectStartParams(keyword_ptrs.as_ptr(), value_ptrs.as_ptr(), 0) };
        let conn = NonNull::new(conn).ok_or(Failure::Error("out of memory".into()))?;
        let connection = Connection {
            conn,
            warning: Box::new(RefCell::new(None)),
        };
        // SAFETY: `conn` is the live connection this value owns; the receiver's argument is the
        // boxed cell, which lives as long as the connection (dropped after PQfinish).
        unsafe {
            if PQstatus(conn.as_ptr()) == CONNECTION_BAD {
                return Err(Failure::Error(connection.error_message()));
            }
            let cell: *const RefCell<Option<String>> = &*connection.warning;
            PQsetNoticeReceiver(conn.as_ptr(), note_warning, cell as *mut c_void);
        }
        // SAFETY: the live connection this value owns; PQconninfo returns NULL only when out of
        // memory, else an array that `options_set` frees.
        let effective = unsafe {
            let options = PQconninfo(conn.as_ptr());
            if options.is_null() {
                return Err(Failure::Error("out of memory".into()));
            }
            options_set(options)
        };
        vet(&effective)?;
        let mut polling = PGRES_POLLING_WRITING;
        loop {
            let event = match polling {
                PGRES_POLLING_OK => break,
                PGRES_POLLING_READING => pg_sys::WL_SOCKET_READABLE,
                PGRES_POLLING_WRITING => pg_sys::WL_SOCKET_WRITEABLE,
                _ => return Err(Failure::Error(connection.error_message())),
            };
            connection.wait_for(event, deadline, stop)?;
            // SAFETY: the live connection this value owns, as PQconnectPoll requires.
            polling = unsafe { PQconnectPoll(conn.as_ptr()) };
        }
        // SAFETY: as above; nonblocking mode makes sending queue rather than wait.
        if unsafe { PQsetnonblocking(conn.as_ptr(), 1) } != 0 {
            return Err(Failure::Error(connection.error_message()));
        }
        Ok(connection)
    }

    /// Runs one statement with text parameters and returns its rows as text. Returns only once the
    /// server is ready for the next query, that is after the statement's implicit commit returned:
    /// a failed commit, or a WARNING such as a synchronous commit whose wait for its standby was
    /// cancelled, is an error.
    pub fn query(
        &mut self,
        sql: &str,
        params: &[String],
        deadline: Instant,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<Vec<Vec<Option<String>>>, Failure> {
        let sql = c_string(sql);
        let values: Vec<CString> = params.iter().map(|value| c_string(value)).collect();
        let value_ptrs: Vec<*const c_char> = values.iter().map(|v| v.as_ptr()).collect();
        self.warning.replace(None);
        let conn = self.conn.as_ptr();
        // SAFETY: a live connection; the statement and `n_params` values are NUL-terminated
        // strings that outlive the call (libpq copies them into its output buffer); NULL types,
        // lengths and formats mean text parameters of types the server infers, and 0 text results.
        let sent = unsafe {
            PQsendQueryParams(
                conn,
                sql.as_ptr(),
                value_ptrs.len() as c_int,
                ptr::null(),
                value_ptrs.as_ptr(),
                ptr::null(),
                ptr::null(),
                0,
            )
        };
        if sent == 0 {
            return Err(Failure::Error(self.error_message()));
        }
        self.flush(deadline, stop)?;
        let rows = self.read_results(deadline, stop)?;
        if let Some(warning) = self.warning.take() {
            return Err(Failure::Error(format!("the registry warned: {warning}")));
        }
        Ok(rows)
    }

    /// Sends what libpq holds of the query, waiting for the socket as it must.
    fn flush(&mut self, deadline: Instant, stop: &mut dyn FnMut() -> bool) -> Result<(), Failure> {
        let conn = self.conn.as_ptr();
        loop {
            // SAFETY: a live connection this value owns, in nonblocking mode.
            match unsafe { PQflush(conn) } {
                0 => return Ok(()),
                1 => {
                    self.wait_for(
                        pg_sys::WL_SOCKET_READABLE | pg_sys::WL_SOCKET_WRITEABLE,
                        deadline,
                        stop,
                    )?;
                    // SAFETY: the live connection, whose socket the wait found ready.
                    if unsafe { PQconsumeInput(conn) } == 0 {
                        return Err(Failure::Error(self.error_message()));
                    }
                }
                _ => return Err(Failure::Error(self.error_message())),
            }
        }
    }

    /// Reads every result of the query sent: its rows, or the first error among them.
    fn read_results(
        &mut self,
        deadline: Instant,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<Vec<Vec<Option<String>>>, Failure> {
        let conn = self.conn.as_ptr();
        let mut rows = vec![];
        let mut error = None;
        loop {
            // SAFETY: a live connection this value owns.
            while unsafe { PQisBusy(conn) } == 1 {
                self.wait_for(pg_sys::WL_SOCKET_READABLE, deadline, stop)?;
                // SAFETY: the live connection, whose socket the wait found readable.
                if unsafe { PQconsumeInput(conn) } == 0 {
                    return Err(Failure::Error(self.error_message()));
                }
            }
            // SAFETY: the live connection, not busy: the next result is complete, or NULL.
            let result = unsafe { PQgetResult(conn) };
            if result.is_null() {
                break;
            }
            // SAFETY: a result libpq just handed out, cleared only below.
            if let Some(result_error) = unsafe { read_result(result, &mut rows) } {
                error.get_or_insert_with(|| result_error.unwrap_or_else(|| self.error_message()));
            }
            // SAFETY: the result is read and cleared once, here; nothing refers to it after.
            unsafe { PQclear(result) };
        }
        match error {
            Some(error) => Err(Failure::Error(error)),
            None => Ok(rows),
        }
    }

    /// Waits until the socket is ready for `events`, the deadline passes, or `stop` says so.
    fn wait_for(
        &self,
        events: u32,
        deadline: Instant,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<(), Failure> {
        loop {
            // SAFETY: the live connection this value owns.
            let socket = unsafe { PQsocket(self.conn.as_ptr()) };
            if socket < 0 {
                return Err(Failure::Error(self.error_message()));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Failure::TimedOut);
            }
            let timeout_ms = left.as_millis().max(1) as std::ffi::c_long;
            let wake =
                pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH | events;
            // SAFETY: MyLatch is this process's own latch, set up before any worker code runs;
            // the socket is libpq's open one, which stays open during the wait.
            let woke = unsafe {
                pg_sys::WaitLatchOrSocket(
                    pg_sys::MyLatch,
                    wake as c_int,
                    socket,
                    timeout_ms,
                    pg_sys::PG_WAIT_EXTENSION,
                )
            } as u32;
            if woke & pg_sys::WL_LATCH_SET != 0 {
                // SAFETY: resetting this process's own latch before looking at what set it.
                unsafe { pg_sys::ResetLatch(pg_sys::MyLatch) };
                crate::server::absorb_barriers();
                if stop() {
                    return Err(Failure::Stopped);
                }
            }
            if woke & events != 0 {
                return Ok(());
            }
        }
    }

    fn error_message(&self) -> String {
        // SAFETY: libpq's message buffer of the live connection, read before any other call.
        let message = unsafe { string_of(PQerrorMessage(self.conn.as_ptr())) };
        message.split_whitespace().collect::<Vec<_>>().join(" ")
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // SAFETY: the connection this value owns, closed once; nothing uses it afterwards.
        unsafe { PQfinish(self.conn.as_ptr()) }
    }
}

/// libpq's notice receiver: keeps the primary message of a WARNING in the connection's cell.
extern "C" fn note_warning(cell: *mut c_void, result: *const PGresult) {
    // SAFETY: `cell` is the argument given with PQsetNoticeReceiver, the connection's boxed cell,
    // alive while libpq can call this; `result` is a notice result libpq passes for this call.
    unsafe {
        let severity = PQresultErrorField(result, PG_DIAG_SEVERITY_NONLOCALIZED);
        if severity.is_null() || CStr::from_ptr(severity).to_bytes() != b"WARNING" {
            return;
        }
        let message = PQresultErrorField(result, PG_DIAG_MESSAGE_PRIMARY);
        let cell = &*(cell as *const RefCell<Option<String>>);
        cell.replace(Some(if message.is_null() {
            "WARNING".into()
        } else {
            string_of(message)
        }));
    }
}

/// Adds the rows of `result` to `rows`. `Some` when it is an error: with `SQLSTATE: message`, or
/// with `None` where the result carries neither, for the connection's message.
///
/// # Safety
/// `result` is a live result of libpq's, not yet cleared.
unsafe fn read_result(
    result: *mut PGresult,
    rows: &mut Vec<Vec<Option<String>>>,
) -> Option<Option<String>> {
    // SAFETY: reads of a live result, within the counts it reports; its values are NUL-terminated
    // strings that live as long as it does.
    unsafe {
        match PQresultStatus(result) {
            PGRES_TUPLES_OK => {
                for row in 0..PQntuples(result) {
                    rows.push(
                        (0..PQnfields(result))
                            .map(|field| {
                                (PQgetisnull(result, row, field) == 0)
                                    .then(|| string_of(PQgetvalue(result, row, field)))
                            })
                            .collect(),
                    );
                }
                None
            }
            PGRES_COMMAND_OK => None,
            _ => {
                let field = |code| {
                    let value = PQresultErrorField(result, code);
                    (!value.is_null()).then(|| string_of(value))
                };
                Some(
                    match (field(PG_DIAG_SQLSTATE), field(PG_DIAG_MESSAGE_PRIMARY)) {
                        (Some(state), Some(message)) => Some(format!("{state}: {message}")),
                        _ => None,
                    },
                )
            }
        }
    }
}

/// A C string of libpq's as Rust text.
///
/// # Safety
/// `pointer` is a NUL-terminated string that stays valid during the call.
unsafe fn string_of(pointer: *const c_char) -> String {
    CStr::from_ptr(pointer).to_string_lossy().into_owned()
}

/// Text for libpq, which cannot hold NUL: cut at the first one (settings never contain any).
fn c_string(text: &str) -> CString {
    CString::new(text.split('\0').next().unwrap_or_default()).expect("no NUL left")
}
