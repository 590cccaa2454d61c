//! Who claims a lease: this server, told apart from every other server and from every copy of its
//! data directory. The registries send it with each claim; the ceiling file records it.

use crate::{hash, server, shmem};
use pgrx::prelude::*;

/// Who claims the lease.
pub struct Claimant {
    /// The same for every run of this server, different for any other server or copy of it: the
    /// system identifier, and a hash of what tells the data directory from every copy of it.
    pub holder: String,
    /// Different for every run of this server (every setup of its shared memory), unless a run
    /// carries on the lease of the run before on the same boot of the machine.
    pub incarnation: String,
    /// For people reading the lease table and refusals: `cluster_name@host:port`, or `host:port`
    /// without a cluster_name. The host name tells apart the nodes of a failover manager, which
    /// gives them all the same cluster_name.
    pub name: String,
}

impl Claimant {
    pub fn of_this_server() -> Claimant {
        let server = server::server_identity();
        let place = data_directory_identity(&server.data_directory).unwrap_or_else(|error| {
            error!("snowid lease worker cannot read the data directory: {error}")
        });
        let host = rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned();
        let name = if server.cluster_name.is_empty() {
            host
        } else {
            format!("{}@{host}", server.cluster_name)
        };
        Claimant {
            holder: format!(
                "{}-{:016x}",
                server.system_identifier,
                hash::fnv1a(place.as_bytes())
            ),
            incarnation: incarnation_text(shmem::lease_status().incarnation),
            name: format!("{name}:{}", server.port),
        }
    }

    /// Claims as a new run of this server from now on (see `shmem::new_incarnation`).
    pub fn become_a_new_run(&mut self) {
        self.incarnation = incarnation_text(shmem::new_incarnation());
    }

    /// Claims as the run `incarnation` from now on: the run before this one, whose lease this run
    /// carries on (see `ceiling::Ceiling::lease_to_carry_on`).
    pub fn carry_on(&mut self, incarnation: u64) {
        self.incarnation = incarnation_text(incarnation);
    }
}

fn incarnation_text(incarnation: u64) -> String {
    format!("{incarnation:016x}")
}

/// What tells a data directory from every copy of it: its device, inode number and birth time
/// (where the file system records one). A restart keeps them, and so do a new host name or port and
/// a rename within the file system; a copy, made anew, has another inode number or birth time, and a
/// snapshot mounted beside the original another device.
fn data_directory_identity(path: &str) -> std::io::Result<String> {
    use rustix::fs::{statx, AtFlags, StatxFlags, CWD};
    let stat = statx(
        CWD,
        path,
        AtFlags::empty(),
        StatxFlags::INO | StatxFlags::BTIME,
    )?;
    let born = if stat.stx_mask & StatxFlags::BTIME.bits() != 0 {
        format!("{}.{:09}", stat.stx_btime.tv_sec, stat.stx_btime.tv_nsec)
    } else {
        "unknown".into()
    };
    Ok(format!(
        "device {}:{} inode {} born {born}",
        stat.stx_dev_major, stat.stx_dev_minor, stat.stx_ino
    ))
}
