//! A real silent drop: a route that discards every packet sent to one
//! loopback address (`ip route add blackhole ADDR/32 table local`). Unlike
//! the proxy's emulation ([`super::proxy::TurnProxy::silence`]), whose
//! kernel still acknowledges every byte, nothing sent to that address is
//! acknowledged any more, so the kernel's own timers act (keep-alive,
//! `TCP_USER_TIMEOUT`), as on a path through a load balancer that lost its
//! state. Needs CAP_NET_ADMIN: root, or `sudo` without a password.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::Command;

/// A loopback address of this process's own (127.77.x.y from its pid),
/// for a proxy that a [`Blackhole`] takes off the network without
/// touching anything else on the machine. A route left on it by a killed
/// run of a process with the same pid is removed first: while it stands,
/// the address is not local and nothing can listen on it.
pub fn private_loopback() -> Ipv4Addr {
    let [_, _, x, y] = std::process::id().to_be_bytes();
    let address = Ipv4Addr::new(127, 77, x, y);
    let _ = ip(&[
        "route",
        "del",
        "blackhole",
        &format!("{address}/32"),
        "table",
        "local",
    ]);
    address
}

/// Every packet to `address` discarded while this lives.
pub struct Blackhole {
    route: String,
}

impl Blackhole {
    pub fn drop_all_to(address: Ipv4Addr) -> Blackhole {
        let route = format!("{address}/32");
        if let Err(e) = ip(&["route", "add", "blackhole", &route, "table", "local"]) {
            panic!(
                "cannot drop packets to {address} (`ip route add blackhole {route} table local`): {e}; \
                 this test needs iproute2 and CAP_NET_ADMIN (run the suite as root, or with sudo \
                 that asks no password)"
            );
        }
        Blackhole { route }
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        if let Err(e) = ip(&["route", "del", "blackhole", &self.route, "table", "local"]) {
            eprintln!("cannot remove the blackhole route {}: {e}", self.route);
        }
    }
}

/// Run `ip ARGS`, through `sudo -n` when not allowed as this user.
fn ip(args: &[&str]) -> Result<(), String> {
    let run = |program: &str, pre: &[&str]| {
        Command::new(program)
            .args(pre)
            .args(args)
            .output()
            .map_err(|e| format!("{program}: {e}"))
            .and_then(|out| {
                if out.status.success() {
                    Ok(())
                } else {
                    Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
                }
            })
    };
    run("ip", &[]).or_else(|direct| {
        run("sudo", &["-n", "ip"]).map_err(|with_sudo| format!("{direct}; with sudo: {with_sudo}"))
    })
}

/// TCP connections of this machine, ESTABLISHED, whose remote end is `to`
/// (the kernel's table, `/proc/net/tcp`): a connection the kernel reset
/// leaves it at once, whether or not its owner has noticed.
pub fn established_to(to: SocketAddrV4) -> usize {
    // Addresses are in the kernel's byte order (little-endian on x86),
    // ports big-endian: 127.0.0.1:8080 is `0100007F:1F90`.
    let remote = format!(
        "{:08X}:{:04X}",
        u32::from_ne_bytes(to.ip().octets()),
        to.port()
    );
    std::fs::read_to_string("/proc/net/tcp")
        .expect("read /proc/net/tcp")
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.get(2) == Some(&remote.as_str()) && fields.get(3) == Some(&"01")
        })
        .count()
}
