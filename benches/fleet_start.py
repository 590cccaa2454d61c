"""A fleet of servers that lease any worker id from one shared registry, started at once (run by
fleet-start.sh).

fleet_start.py measure: starts the servers that --servers lists together, times each one until it
issues, then adds claimants until the registry holds each of --leases leases, and writes what it
measured as JSON.
fleet_start.py report: turns the JSON of each registry into fleet-start.md and fleet-start.json.

The start: every server's `pg_ctl start` is launched at once (without waiting), and one thread per
server connects as soon as the server accepts, then calls `snowid_wait_ready()` and `snowid_next()`
until an id comes back: the time from the launch to that id is the server's time to issue. Once
all of them issue, each makes 1,000 more ids; every server's ids must carry one worker id, no two
servers the same, and no id may come twice. Meanwhile: the registry's CPU (user and system time of
its processes, by /proc: for PostgreSQL the postmaster, its live children and the children it
reaped, each PostgreSQL process's own time by the scheduler's count in nanoseconds; for etcd its
one process) and its statements (PostgreSQL: statements run, by
pg_stat_statements, which counts them as they end; etcd: gRPC calls handled, each request to its
JSON gateway being one), sampled every second.

The steady state: claimants play the servers beyond the fleet. Each claimant is one connection
(PostgreSQL) or one keep-alive HTTP connection (etcd) making the very calls the lease worker makes
with snowid.any_worker_id on, from src/registry/remote and src/registry/etcd/claims.rs: a claim of
any worker id, then a renewal of the one it got (a claim naming it) every third of the lease's
time-to-live, timed from when the last one was sent; a call that fails is tried again a second
later on a new connection. New claimants make their first claims at random moments spread over one
renewal interval (or at 50 a second, when there are more), so that renewals are spread as a
fleet's are. Once every lease is held, a window of --window seconds measures the registry's CPU
and the renewals it served (PostgreSQL: statements calling snowid.lease_claim, by
pg_stat_statements; etcd: etcd lease keep-alives, one per renewal, by
etcd_debugging_lease_renewed_total), servers' and claimants' alike. Before the start, the idle
registry's CPU is measured for --idle seconds.
"""

import argparse
import base64
import ctypes
import ctypes.util
import helpers
import http.client
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import threading
import time
import uuid

SNOWID_EPOCH_UNIX_MS = 1767225600000
IDS_PER_SERVER = 1000
# The lease worker's session, as src/registry/remote/conninfo.rs sets it up.
SESSION_OPTIONS = ("-c search_path=pg_catalog,pg_temp -c synchronous_commit=on -c client_min_messages=warning "
                   "-c statement_timeout=2000 -c lock_timeout=2000")

# core/src/lease/sql.rs: what the worker asks a new connection, and its claim of any worker id.
READY_SQL = """SELECT pg_catalog.count(*) = 3 FROM pg_catalog.pg_depend d
     JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid AND e.extname = 'snowid'
     WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND d.deptype = 'e'
       AND d.objid IN (
         pg_catalog.to_regprocedure('snowid.lease_claim(integer, text, text, text, bigint, bigint, boolean, bigint)'),
         pg_catalog.to_regprocedure('snowid.lease_claim_any(text, text, text, bigint, bigint, bigint)'),
         pg_catalog.to_regprocedure('snowid.lease_release(integer, text, text, bigint, bigint)'))"""
FENCING_READY_SQL = """SELECT pg_catalog.count(*) = 3 FROM pg_catalog.pg_depend d
     JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid AND e.extname = 'snowid'
     WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND d.deptype = 'e'
       AND pg_catalog.has_function_privilege(d.objid, 'EXECUTE')
       AND d.objid IN (
         pg_catalog.to_regprocedure('snowid.lease_claim(integer, text, text, text, bigint, bigint, boolean, bigint, boolean, bigint)'),
         pg_catalog.to_regprocedure('snowid.lease_claim_any(text, text, text, bigint, bigint, bigint, integer, bigint)'),
         pg_catalog.to_regprocedure('snowid.lease_release(integer, text, text, bigint, bigint, bigint)'))"""
HOLDING_READY_SQL = """SELECT pg_catalog.count(*) = 2 FROM pg_catalog.pg_depend d
     JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid AND e.extname = 'snowid'
     WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND d.deptype = 'e'
       AND pg_catalog.has_function_privilege(d.objid, 'EXECUTE')
       AND d.objid IN (
         pg_catalog.to_regprocedure('snowid.lease_claim(integer, text, text, text, bigint, bigint, boolean, bigint, boolean)'),
         pg_catalog.to_regprocedure('snowid.lease_claim_any(text, text, text, bigint, bigint, bigint, integer)'))"""
CLAIM_FENCED_SQL = ("SELECT $1::pg_catalog.int4, granted, floor_ms, reserved_until_ms, holder_name, expires_at_unix_ms, "
                    "continued, renewal, released, tenure, fenced "
                    "FROM snowid.lease_claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)")
CLAIM_ANY_FENCED_SQL = ("SELECT worker_id, granted, floor_ms, reserved_until_ms, holder_name, expires_at_unix_ms, "
                        "continued, renewal, released, tenure, fenced "
                        "FROM snowid.lease_claim_any($1, $2, $3, $4, $5, $6, $7, $8)")


class PgError(Exception):
    pass


class Libpq:
    """The few calls of libpq the helper needs, through ctypes: no driver to install."""

    def __init__(self):
        self.lib = lib = ctypes.CDLL(ctypes.util.find_library("pq") or "libpq.so.5")
        lib.PQconnectdb.restype = ctypes.c_void_p
        lib.PQconnectdb.argtypes = [ctypes.c_char_p]
        lib.PQstatus.argtypes = [ctypes.c_void_p]
        lib.PQerrorMessage.restype = ctypes.c_char_p
        lib.PQerrorMessage.argtypes = [ctypes.c_void_p]
        lib.PQfinish.argtypes = [ctypes.c_void_p]
        lib.PQexecParams.restype = ctypes.c_void_p
        lib.PQexecParams.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p,
                                     ctypes.POINTER(ctypes.c_char_p), ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_int]
        lib.PQresultStatus.argtypes = [ctypes.c_void_p]
        lib.PQresultErrorMessage.restype = ctypes.c_char_p
        lib.PQresultErrorMessage.argtypes = [ctypes.c_void_p]
        lib.PQntuples.argtypes = [ctypes.c_void_p]
        lib.PQnfields.argtypes = [ctypes.c_void_p]
        lib.PQgetisnull.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        lib.PQgetvalue.restype = ctypes.c_char_p
        lib.PQgetvalue.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        lib.PQclear.argtypes = [ctypes.c_void_p]


LIBPQ = None


class Connection:
    def __init__(self, conninfo):
        lib = LIBPQ.lib
        self.conn = lib.PQconnectdb(conninfo.encode())
        if lib.PQstatus(self.conn) != 0:
            message = lib.PQerrorMessage(self.conn).decode(errors="replace").strip()
            lib.PQfinish(self.conn)
            self.conn = None
            raise PgError(message)

    def query(self, sql, params=()):
        lib = LIBPQ.lib
        values = (ctypes.c_char_p * max(len(params), 1))(*[str(p).encode() for p in params])
        result = lib.PQexecParams(self.conn, sql.encode(), len(params), None, values, None, None, 0)
        try:
            if lib.PQresultStatus(result) not in (1, 2):
                raise PgError((lib.PQresultErrorMessage(result) or lib.PQerrorMessage(self.conn))
                              .decode(errors="replace").strip())
            return [[None if lib.PQgetisnull(result, row, column) else lib.PQgetvalue(result, row, column).decode()
                     for column in range(lib.PQnfields(result))] for row in range(lib.PQntuples(result))]
        finally:
            lib.PQclear(result)

    def close(self):
        if self.conn:
            LIBPQ.lib.PQfinish(self.conn)
            self.conn = None


def pg_conninfo(port, extra=""):
    return f"host=127.0.0.1 port={port} dbname=postgres user=postgres connect_timeout=10 {extra}"


def now_ms():
    """Milliseconds since snowid's epoch, by this machine's clock, as the lease worker counts them."""
    return int(time.time() * 1000) - SNOWID_EPOCH_UNIX_MS


def worker_of(snowid):
    return (snowid >> 12) & 1023


# --- the registry's CPU ---------------------------------------------------------------------------

TICKS = os.sysconf("SC_CLK_TCK")


def stat_of(pid):
    """(ppid, utime + stime of every thread, cutime + cstime) of a process in ticks, None if it is
    gone."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            text = file.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2:].split()
    # fields[0] is the state (field 3); utime, stime, cutime and cstime are fields 14 to 17.
    return int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def run_time(pid, ticks):
    """A single-threaded process's time on a CPU, in seconds: by the scheduler's count in
    nanoseconds where it can be read, else `ticks`."""
    try:
        with open(f"/proc/{pid}/schedstat") as file:
            return int(file.read().split()[0]) / 1e9
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return ticks / TICKS


def cpu_seconds(pid, single_threaded):
    """The CPU time of `pid`, its live children and the children it reaped, in seconds. PostgreSQL's
    processes have one thread each: their own time comes from the scheduler's count in nanoseconds,
    finer than the ticks (1/100 s) of utime and stime."""
    own = stat_of(pid)
    if own is None:
        sys.exit(f"the registry's process {pid} is gone")
    total = (run_time(pid, own[1]) if single_threaded else own[1] / TICKS) + own[2] / TICKS
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != pid:
            child = stat_of(entry)
            if child and child[0] == pid:
                total += (run_time(entry, child[1]) if single_threaded else child[1] / TICKS) + child[2] / TICKS
    return total


# --- the registry's counters ----------------------------------------------------------------------

class PostgresRegistry:
    kind = "postgres"

    def __init__(self, args):
        self.port = args.registry_port
        self.pid = args.registry_pid
        self.monitor = Connection(pg_conninfo(self.port, "application_name=fleet_start_monitor"))
        self.reads = 0

    def counters(self):
        """(statements, renewals): statements run on the registry, less this monitor's own reads,
        and those that renewed a lease (a claim of the worker id the server holds), both by
        pg_stat_statements."""
        row = self.monitor.query(
            "SELECT coalesce(sum(calls), 0), coalesce(sum(calls) FILTER (WHERE query LIKE '%snowid.lease_claim($1,%'), 0)"
            " FROM pg_stat_statements")[0]
        self.reads += 1
        return int(row[0]) - self.reads, int(row[1])

    def claimant(self, number, args, stats):
        return PostgresClaimant(number, args, stats)


class EtcdRegistry:
    kind = "etcd"

    def __init__(self, args):
        self.host, self.port = args.etcd.rsplit(":", 1)
        self.pid = args.registry_pid
        self.prefix = args.etcd_prefix

    def counters(self):
        """(statements, renewals): gRPC calls etcd handled (the gateway's requests become calls
        inside etcd), and its lease keep-alives."""
        connection = http.client.HTTPConnection(self.host, int(self.port), timeout=10)
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
        connection.close()
        calls = renewals = 0
        for line in text.splitlines():
            if line.startswith("grpc_server_handled_total{"):
                calls += int(float(line.rsplit(" ", 1)[1]))
            elif line.startswith("etcd_debugging_lease_renewed_total "):
                renewals = int(float(line.rsplit(" ", 1)[1]))
        return calls, renewals

    def claimant(self, number, args, stats):
        return EtcdClaimant(number, args, stats, self)


class Stats:
    """What the claimants did, counted across their threads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.claimed = {}  # claimant number: worker id
        self.renewals = 0
        # Calls that failed (a statement timeout, a lost connection), tried again after a second
        # on a new connection, as the lease worker does; and renewals the registry refused.
        self.claim_errors = 0
        self.renewal_errors = 0
        self.first_errors = []
        self.failures = []

    def count(self, name, error):
        with self.lock:
            setattr(self, name, getattr(self, name) + 1)
            if len(self.first_errors) < 5:
                self.first_errors.append(str(error))

    def fail(self, what):
        with self.lock:
            if len(self.failures) < 20:
                self.failures.append(what)


# --- claimants ------------------------------------------------------------------------------------

class Claimant:
    """Plays a server with snowid.any_worker_id on: claims any worker id, then renews it every third
    of the lease's time-to-live, timed from when the last renewal was sent; a call that fails drops
    the connection and is tried again a second later, on a new one (src/worker.rs, retry_every)."""

    def __init__(self, number, args, stats):
        self.number = number
        self.ttl_ms = args.lease_ttl * 1000
        self.every = args.lease_ttl / 3
        self.stats = stats
        # Who claims, as src/claimant.rs makes it: a system identifier and a hash of the place.
        self.holder = f"7{number:018d}-{random.getrandbits(64):016x}"
        self.incarnation = str(uuid.uuid4())
        self.name = f"claimant{number}@{platform.node()}:0"
        self.worker_id = None
        self.known_mark = -1
        self.stop = threading.Event()
        self.connected = False

    def attempt(self):
        """One claim or renewal: whether it was granted; an error counts, and drops the connection."""
        renewing = self.worker_id is not None
        try:
            if not self.connected:
                self.connect()
                self.connected = True
            return self.claim()
        except (PgError, RuntimeError, OSError, http.client.HTTPException, ValueError, KeyError) as error:
            self.stats.count("renewal_errors" if renewing else "claim_errors", error)
            self.close()
            self.connected = False
            return False

    def run(self, delay):
        try:
            if self.stop.wait(delay):
                return
            while not self.attempt():
                if self.stop.wait(1):
                    return
            with self.stats.lock:
                self.stats.claimed[self.number] = self.worker_id
            next_at = time.monotonic() + self.every
            while not self.stop.wait(max(0.0, next_at - time.monotonic())):
                sent = time.monotonic()
                if self.attempt():
                    next_at = sent + self.every
                    with self.stats.lock:
                        self.stats.renewals += 1
                else:
                    next_at = sent + 1
        except Exception as error:  # noqa: BLE001 - reported, never hidden
            self.stats.fail(f"claimant {self.number}: {error}")
        finally:
            self.close()


class PostgresClaimant(Claimant):
    def __init__(self, number, args, stats):
        super().__init__(number, args, stats)
        self.port = args.registry_port
        self.connection = None

    def connect(self):
        options = SESSION_OPTIONS.replace("'", "\\'")
        self.connection = Connection(pg_conninfo(self.port, f"options='{options}' "
                                                            "application_name='snowid lease worker'"))
        # Asked at each new connection, as the worker does: its functions, then the newer ones.
        for sql in (READY_SQL, FENCING_READY_SQL, HOLDING_READY_SQL):
            if self.connection.query(sql) != [["t"]]:
                raise PgError(f"the registry answered false to {sql[:40]}...")

    def claim(self):
        reserve_until = now_ms() + self.ttl_ms
        if self.worker_id is None:
            # The first claim, of any worker id (src/registry/mod.rs, ClaimCall).
            row = self.connection.query(CLAIM_ANY_FENCED_SQL, [
                self.holder, self.incarnation, self.name, self.ttl_ms, reserve_until, 1, -1, -1])[0]
            known = reserve_until
        else:
            # A renewal names the worker id held, and takes over an expired lease on a shared registry.
            known = max(self.known_mark, reserve_until)
            row = self.connection.query(CLAIM_FENCED_SQL, [
                self.worker_id, self.holder, self.incarnation, self.name, self.ttl_ms, reserve_until, "true", 1,
                "true", known])[0]
        if row[1] != "t":
            if self.worker_id is not None:
                self.stats.count("renewal_errors", f"the renewal of worker id {self.worker_id} was refused: {row}")
            return False
        self.worker_id = int(row[0])
        self.known_mark = max(known, int(row[3]))
        return True

    def close(self):
        if self.connection:
            self.connection.close()


def encode(text):
    return base64.b64encode(text.encode()).decode()


def decode(text):
    return base64.b64decode(text).decode()


def fnv1a(data):
    value = 0xcbf29ce484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return value


def lease_id(prefix, worker_id):
    """src/registry/etcd/keys.rs: each worker id's etcd lease ID."""
    return (max(fnv1a(prefix.encode()) >> 11, 1) << 10) | worker_id


class EtcdClaimant(Claimant):
    # Worker ids a claimant of this process is taking, so that two do not race for one.
    picking_lock = threading.Lock()
    picking = set()

    def __init__(self, number, args, stats, registry):
        super().__init__(number, args, stats)
        self.registry = registry
        self.prefix = registry.prefix
        self.http = None

    def connect(self):
        self.http = http.client.HTTPConnection(self.registry.host, int(self.registry.port), timeout=10)

    def call(self, path, body):
        self.http.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = self.http.getresponse()
        data = json.loads(response.read() or b"{}")
        if response.status != 200:
            raise RuntimeError(f"etcd answered {path} with {response.status}: {data}")
        return data

    def key(self, kind, worker_id=None):
        return f"{self.prefix}/{kind}/" if worker_id is None else f"{self.prefix}/{kind}/{worker_id}"

    def range_prefix(self, kind):
        start = self.key(kind)
        return self.call("/v3/kv/range", {"key": encode(start), "range_end": encode(start[:-1] + "0")}).get("kvs", [])

    def read(self, worker_id):
        reply = self.call("/v3/kv/txn", {"success": [
            {"request_range": {"key": encode(self.key(kind, worker_id))}} for kind in ("workers", "holders", "marks")]})
        slots = []
        for response in reply["responses"]:
            kvs = response["response_range"].get("kvs", [])
            slots.append(kvs[0] if kvs else {})
        return slots

    def commit(self, worker_id, slots, ops):
        compare = [{"key": encode(self.key(kind, worker_id)), "target": "MOD", "result": "EQUAL",
                    "mod_revision": slot.get("mod_revision", "0")}
                   for kind, slot in zip(("workers", "holders", "marks"), slots)]
        return self.call("/v3/kv/txn", {"compare": compare, "success": ops}).get("succeeded", False)

    def claim(self):
        # Etcd::hold_back: the epoch key, then the status of the member that answered.
        self.call("/v3/kv/range", {"key": encode(f"{self.prefix}/epoch")})
        self.call("/v3/maintenance/status", {})
        if self.worker_id is not None:
            return self.renew()
        # Etcd::claim_any: the holders, for a record of this run.
        holders = self.range_prefix("holders")
        # Read as the worker reads it; only this claimant's own record would matter, and it has none.
        if any(self.holder in decode(kv.get("value", "")) for kv in holders):
            raise RuntimeError("a record of this claimant before its claim")
        taken = {int(decode(kv["key"]).rsplit("/", 1)[1]) for kv in self.range_prefix("workers") if kv.get("lease")}
        with EtcdClaimant.picking_lock:
            free = [wid for wid in range(1024) if wid not in taken and wid not in EtcdClaimant.picking]
            if not free:
                return False
            worker_id = free[0]
            EtcdClaimant.picking.add(worker_id)
        claimed = False
        try:
            slots = self.read(worker_id)
            if slots[0].get("lease"):
                return False
            mark = int(decode(slots[2]["value"])) if slots[2].get("value") else 0
            new_mark = max(mark + 1, now_ms() + self.ttl_ms)
            lease = lease_id(self.prefix, worker_id)
            try:
                granted = self.call("/v3/lease/grant", {"ID": str(lease), "TTL": str(self.ttl_ms // 1000)})
            except RuntimeError:
                return False  # its etcd lease exists: another took the worker id meanwhile
            if int(granted.get("TTL", 0)) <= 0:
                return False
            record = json.dumps({"holder": self.holder, "incarnation": self.incarnation, "name": self.name,
                                 "tenure": int(time.time() * 1e6), "acquired_mark_ms": mark})
            ops = [{"request_put": {"key": encode(self.key("workers", worker_id)), "value": encode(self.name),
                                    "lease": str(lease)}},
                   {"request_put": {"key": encode(self.key("holders", worker_id)), "value": encode(record),
                                    "lease": str(lease)}},
                   {"request_put": {"key": encode(self.key("marks", worker_id)), "value": encode(str(new_mark))}}]
            if not self.commit(worker_id, slots, ops):
                self.call("/v3/lease/revoke", {"ID": str(lease)})
                return False
            self.worker_id = worker_id
            claimed = True
            return True
        finally:
            # A worker id taken stays set aside: the next claimant may have read the keys before.
            if not claimed:
                with EtcdClaimant.picking_lock:
                    EtcdClaimant.picking.discard(worker_id)

    def renew(self):
        # Etcd::try_claim and Etcd::renew: the three keys, a keep-alive, the mark raised.
        slots = self.read(self.worker_id)
        mark = int(decode(slots[2]["value"]))
        reply = self.call("/v3/lease/keepalive", {"ID": str(lease_id(self.prefix, self.worker_id))})
        if int(reply.get("result", {}).get("TTL", 0)) <= 0:
            # Renewed too late: claimed anew at the next attempt, as the worker does.
            self.stats.count("renewal_errors", f"the etcd lease of worker id {self.worker_id} ran out")
            self.worker_id = None
            return False
        new_mark = max(mark + 1, now_ms() + self.ttl_ms)
        ops = [{"request_put": {"key": encode(self.key("marks", self.worker_id)), "value": encode(str(new_mark))}}]
        if not self.commit(self.worker_id, slots, ops):
            self.stats.count("renewal_errors", f"the keys of worker id {self.worker_id} changed")
            return False
        return True

    def close(self):
        if self.http:
            self.http.close()


# --- the measurement ------------------------------------------------------------------------------

def as_owner(command):
    return ["runuser", "-u", "postgres", "--"] + command if os.geteuid() == 0 else command


def percentile(values, share):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * (len(ordered) - 1))))]


def start_fleet(args, registry, servers):
    """Starts every server at once; returns the start's figures."""
    results = [None] * len(servers)
    samples = []
    done = threading.Event()

    def sample():
        while True:
            statements, claims = registry.counters()
            samples.append((time.monotonic() - launched, statements, claims))
            if done.wait(1):
                return

    def watch(index, port):
        connected_at = None
        last_error = None
        deadline = launched + args.start_limit
        while time.monotonic() < deadline:
            try:
                # The refusals' warnings before the lease is held are not printed.
                connection = Connection(pg_conninfo(port, "connect_timeout=2 options='-c client_min_messages=error'"))
            except PgError as error:
                last_error = str(error)
                time.sleep(0.1)
                continue
            connected_at = time.monotonic() - launched
            try:
                while time.monotonic() < deadline:
                    try:
                        connection.query("SELECT snowid_wait_ready('1 second')")
                        snowid = int(connection.query("SELECT snowid_next()")[0][0])
                    except PgError as error:
                        last_error = str(error)
                        time.sleep(0.01)
                        continue
                    issued_at = time.monotonic() - launched
                    ids = [snowid] + [int(row[0]) for row in connection.query(
                        f"SELECT snowid_next() FROM generate_series(1, {IDS_PER_SERVER})")]
                    results[index] = {"port": port, "accepting_s": connected_at, "issued_s": issued_at,
                                      "worker_id": worker_of(snowid), "ids": ids}
                    return
            finally:
                connection.close()
        results[index] = {"port": port, "error": last_error}

    cpu_before = cpu_seconds(registry.pid, registry.kind == "postgres")
    launched = time.monotonic()
    sampler = threading.Thread(target=sample)
    sampler.start()
    starters = [subprocess.Popen(as_owner([args.pg_ctl, "-D", data, "-l", f"{os.path.dirname(data)}/server.log",
                                           "start"]), stdout=subprocess.DEVNULL)
                for data, _ in servers]
    watchers = [threading.Thread(target=watch, args=(index, port)) for index, (_, port) in enumerate(servers)]
    for watcher in watchers:
        watcher.start()
    for starter in starters:
        starter.wait()
    for watcher in watchers:
        watcher.join()
    all_issued = time.monotonic() - launched
    cpu_used = cpu_seconds(registry.pid, registry.kind == "postgres") - cpu_before
    done.set()
    sampler.join()
    statements, renewals = registry.counters()
    samples.append((time.monotonic() - launched, statements, renewals))
    failed = [result for result in results if "error" in result]
    if failed:
        sys.exit(f"{len(failed)} servers never issued within {args.start_limit} s, "
                 f"the first on port {failed[0]['port']}: {failed[0]['error']}")
    worker_ids = [result["worker_id"] for result in results]
    if len(set(worker_ids)) != len(worker_ids):
        sys.exit(f"two servers issued under one worker id: {sorted(worker_ids)}")
    for result in results:
        if {worker_of(snowid) for snowid in result["ids"]} != {result["worker_id"]}:
            sys.exit(f"the server on port {result['port']} issued under more than one worker id")
    every_id = [snowid for result in results for snowid in result["ids"]]
    if len(set(every_id)) != len(every_id):
        sys.exit("an id was issued twice")
    # The statements up to the last server's first id, from the samples a second apart.
    first, last = samples[0], next((s for s in samples if s[0] >= all_issued), samples[-1])
    rates = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(samples, samples[1:]) if b[0] <= last[0] + 1e-9]
    times = [result["issued_s"] for result in results]
    accepting = [result["accepting_s"] for result in results]
    return {
        "servers": len(servers),
        "issued_s": times,
        "accepting_s": accepting,
        "worker_ids": sorted(worker_ids),
        "ids_checked": len(every_id),
        "all_issued_s": max(times),
        "registry_cpu_s": cpu_used,
        "statements": last[1] - first[1],
        "statements_window_s": last[0] - first[0],
        "peak_statements_per_s": max(rates) if rates else 0,
    }


def steady(args, registry, servers, start):
    """Adds claimants up to each size of --leases and measures a window at each."""
    stats = Stats()
    claimants = []
    threads = []
    levels = []
    every = args.lease_ttl / 3
    try:
        # The fleet's own renewals first settle: one renewal interval after the last server issued.
        time.sleep(every)
        for leases in args.leases:
            wanted = leases - len(servers)
            added = range(len(claimants), wanted)
            # First claims spread over a renewal interval, or at 50 a second when there are more.
            spread = max(every, len(added) / 50)
            for number in added:
                claimant = registry.claimant(number, args, stats)
                thread = threading.Thread(target=claimant.run, args=(random.uniform(0, spread),), daemon=True)
                claimants.append(claimant)
                threads.append(thread)
                thread.start()
            deadline = time.monotonic() + spread + args.start_limit
            while len(stats.claimed) < wanted:
                if stats.failures:
                    sys.exit(f"a claimant failed: {stats.failures[0]}")
                if time.monotonic() > deadline:
                    sys.exit(f"only {len(stats.claimed)} of {wanted} claimants hold a lease")
                time.sleep(0.2)
            held = sorted(stats.claimed.values()) + start["worker_ids"]
            if len(set(held)) != len(held):
                sys.exit("two holders of one worker id")
            time.sleep(1)
            print(f"    {leases} leases held; measuring for {args.window} s", file=sys.stderr, flush=True)
            cpu_before, counters_before, at_before = cpu_seconds(registry.pid, registry.kind == "postgres"), registry.counters(), time.monotonic()
            renewals_before, renewal_errors_before = stats.renewals, stats.renewal_errors
            time.sleep(args.window)
            cpu_after, counters_after, at_after = cpu_seconds(registry.pid, registry.kind == "postgres"), registry.counters(), time.monotonic()
            seconds = at_after - at_before
            renewals = counters_after[1] - counters_before[1]
            levels.append({
                "leases": leases,
                "claimants": wanted,
                "window_s": seconds,
                "registry_cpu_s": cpu_after - cpu_before,
                "statements": counters_after[0] - counters_before[0],
                "renewals": renewals,
                "claimant_renewals": stats.renewals - renewals_before,
                "claimant_renewal_errors": stats.renewal_errors - renewal_errors_before,
                "claim_errors_so_far": stats.claim_errors,
                "first_errors": list(stats.first_errors),
            })
            if stats.first_errors:
                print(f"    claimants' calls that failed so far: {stats.claim_errors} claims, "
                      f"{stats.renewal_errors} renewals, the first: {stats.first_errors[0]}", file=sys.stderr, flush=True)
            if stats.failures:
                sys.exit(f"a claimant failed: {stats.failures[0]}")
        # Every server still issues, under its worker id.
        for _, port in servers:
            connection = Connection(pg_conninfo(port))
            snowid = int(connection.query("SELECT snowid_next()")[0][0])
            connection.close()
            if worker_of(snowid) not in start["worker_ids"]:
                sys.exit(f"the server on port {port} issued under worker id {worker_of(snowid)}")
    finally:
        for claimant in claimants:
            claimant.stop.set()
        for thread in threads:
            thread.join(timeout=15)
    return levels


def measure(args):
    global LIBPQ
    LIBPQ = Libpq()
    threading.stack_size(512 * 1024)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    args.leases = [int(size) for size in args.leases.split(",")]
    servers = []
    with open(args.servers) as listing:
        for line in listing:
            data, port = line.split()
            servers.append((data, int(port)))
    registry = PostgresRegistry(args) if args.registry == "postgres" else EtcdRegistry(args)
    print(f"==> {args.registry}", file=sys.stderr, flush=True)
    # The registry's own background work, with no server yet: what each size's CPU includes anyway.
    print(f"    the registry idle for {args.idle} s", file=sys.stderr, flush=True)
    single_threaded = registry.kind == "postgres"
    cpu_before, at_before = cpu_seconds(registry.pid, single_threaded), time.monotonic()
    time.sleep(args.idle)
    idle = {"window_s": time.monotonic() - at_before,
            "registry_cpu_s": cpu_seconds(registry.pid, single_threaded) - cpu_before}
    print(f"    starting {len(servers)} servers at once", file=sys.stderr, flush=True)
    start = start_fleet(args, registry, servers)
    print(f"    every server issued within {start['all_issued_s']:.2f} s, under worker ids "
          f"{start['worker_ids'][0]}..{start['worker_ids'][-1]}, all distinct; {start['ids_checked']:,} ids, "
          "none twice", file=sys.stderr, flush=True)
    levels = steady(args, registry, servers, start)
    with open(args.out, "w") as out:
        json.dump({"registry": args.registry, "registry_version": args.registry_version,
                   "lease_ttl": args.lease_ttl, "settings": args.settings, "snowid": args.snowid, "idle": idle,
                   "start": start,
                   "levels": levels}, out)


# --- the report -----------------------------------------------------------------------------------

NAMES = {"postgres": "PostgreSQL", "etcd": "etcd"}


def report(args):
    runs = []
    for path in args.files:
        with open(path) as file:
            runs.append(json.load(file))
    first = runs[0]
    lines = [
        "# A fleet that starts at once",
        "",
        f"Machine: {helpers.machine()}; every server and the registry on it. {first['start']['servers']} "
        f"PostgreSQL servers ({first['settings']}), each with `snowid.any_worker_id = on` and "
        f"`snowid.lease_ttl = {first['lease_ttl']}` (a renewal every {first['lease_ttl'] / 3:g} s), "
        "started together (every `pg_ctl start` launched at once) against one shared registry: "
        + "; ".join(f"{NAMES[run['registry']]} {run['registry_version']}" for run in runs)
        + f". snowid: {first['snowid']}.",
        "",
        "## The start",
        "",
        "Time from the launch until the server accepted connections, and until it issued its first id "
        "(`snowid_next()` answered); the registry's CPU (user and system, all its processes) and "
        "its statements (PostgreSQL: statements, by `pg_stat_statements`; etcd: gRPC calls, one per request to "
        "its JSON gateway) from the launch until the last server issued.",
        "",
        "| registry | servers | accepting, median | issued: min | median | p95 | max | issued after accepting: median, max | distinct worker ids | ids, none twice | registry CPU | statements | per second (mean, peak) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for run in runs:
        start = run["start"]
        times = start["issued_s"]
        after = [issued - accepting for issued, accepting in zip(times, start["accepting_s"])]
        mean_rate = start["statements"] / start["statements_window_s"] if start["statements_window_s"] else 0
        lines.append(
            f"| {NAMES[run['registry']]} | {start['servers']} | {statistics.median(start['accepting_s']):.2f} s "
            f"| {min(times):.2f} s | {statistics.median(times):.2f} s | {percentile(times, 0.95):.2f} s "
            f"| {max(times):.2f} s | {statistics.median(after):.2f} s, {max(after):.2f} s | {len(start['worker_ids'])}: {start['worker_ids'][0]} to {start['worker_ids'][-1]} "
            f"| {start['ids_checked']:,} | {start['registry_cpu_s']:.2f} s "
            f"| {start['statements']:,} | {mean_rate:,.0f}, {start['peak_statements_per_s']:,.0f} |")
    lines += [
        "",
        "## Holding leases",
        "",
        f"The {first['start']['servers']} servers and claimants playing the other servers (each one "
        "connection, or one HTTP connection, making the lease worker's very claim and renewal calls, "
        "every third of the time-to-live, their phases spread at random), each size measured over a "
        f"window of {first['levels'][0]['window_s']:.0f} s once every lease was held. Renewals: "
        "PostgreSQL, statements calling `snowid.lease_claim` (`pg_stat_statements`); etcd, lease "
        "keep-alives (`etcd_debugging_lease_renewed_total`), one per renewal. Each renewal is one "
        "statement on PostgreSQL (`snowid.lease_claim` of the worker id held), five requests on etcd "
        "(the epoch key, the member's status, the worker id's three keys, the keep-alive, the mark "
        "raised).",
        "",
        "| registry | leases | renewals/s | statements/s | registry CPU, share of one core | CPU per renewal | against the first size | beyond the idle registry's, per renewal |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        idle_share = run["idle"]["registry_cpu_s"] / run["idle"]["window_s"]
        lines.append(f"| {NAMES[run['registry']]} | 0 (idle, before the start) | | | {100 * idle_share:.1f}% | | | |")
        base = None
        for level in run["levels"]:
            per_renewal = level["registry_cpu_s"] / level["renewals"] if level["renewals"] else 0
            beyond = ((level["registry_cpu_s"] - idle_share * level["window_s"]) / level["renewals"]
                      if level["renewals"] else 0)
            base = base or per_renewal
            lines.append(
                f"| {NAMES[run['registry']]} | {level['leases']:,} | {level['renewals'] / level['window_s']:.1f} "
                f"| {level['statements'] / level['window_s']:,.1f} "
                f"| {100 * level['registry_cpu_s'] / level['window_s']:.1f}% "
                f"| {1000 * per_renewal:.2f} ms | {per_renewal / base if base else 0:.2f}× | {1000 * beyond:.2f} ms |")
    failed = [(run, level) for run in runs for level in run["levels"]
              if level["claimant_renewal_errors"] or level["claim_errors_so_far"]]
    lines += ["", "Claimants' calls that failed and were tried again: "
              + ("; ".join(f"{NAMES[run['registry']]} at {level['leases']:,} leases, {level['claim_errors_so_far']} "
                           f"claims so far and {level['claimant_renewal_errors']} renewals in the window "
                           f"(the first: {level['first_errors'][0] if level['first_errors'] else ''})"
                           for run, level in failed) if failed else "none.")]
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as out:
        out.write(text)
    # Every figure, each server's times included, beside the table.
    for run in runs:
        for result in run["start"].get("results", []):
            result.pop("ids", None)
    with open(os.path.splitext(args.out)[0] + ".json", "w") as out:
        json.dump(runs, out, indent=1)
    print(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("measure")
    run.add_argument("--registry", choices=["postgres", "etcd"], required=True)
    run.add_argument("--registry-pid", type=int, required=True)
    run.add_argument("--registry-port", type=int)
    run.add_argument("--registry-version", required=True)
    run.add_argument("--etcd", help="HOST:PORT of the etcd member")
    run.add_argument("--etcd-prefix", default="/snowid")
    run.add_argument("--servers", required=True, help="a file: one 'DATA_DIRECTORY PORT' line per server")
    run.add_argument("--pg-ctl", required=True)
    run.add_argument("--lease-ttl", type=int, required=True)
    run.add_argument("--leases", required=True, help="sizes, such as 64,256,1024")
    run.add_argument("--window", type=int, required=True)
    run.add_argument("--start-limit", type=int, default=300)
    run.add_argument("--idle", type=int, default=20, help="seconds the idle registry's CPU is measured for")
    run.add_argument("--settings", required=True, help="the servers' settings, for the report")
    run.add_argument("--snowid", required=True, help="which build of snowid, for the report")
    run.add_argument("--out", required=True)
    summary = commands.add_parser("report")
    summary.add_argument("--out", required=True)
    summary.add_argument("files", nargs="+")
    args = parser.parse_args()
    measure(args) if args.command == "measure" else report(args)


if __name__ == "__main__":
    main()
