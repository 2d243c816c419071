//! systemd readiness: `READY=1` / `STOPPING=1` to `$NOTIFY_SOCKET`, for a `Type=notify` unit.
//!
//! The protocol is one unix datagram per state change, sent to the socket
//! systemd names in `NOTIFY_SOCKET` (a path, or `@name` for the abstract
//! namespace). Without the variable (not under systemd, or `Type=exec`)
//! nothing is sent. A few lines of our own rather than libsystemd: the
//! static binary links no C library but its own.

use std::io;
use std::os::unix::net::UnixDatagram;

/// Sends `state` (e.g. `READY=1`) to `$NOTIFY_SOCKET`; `Ok(false)` when the
/// variable is unset or empty.
pub fn notify(state: &str) -> io::Result<bool> {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let socket = socket.to_string_lossy().into_owned();
    if socket.is_empty() {
        return Ok(false);
    }
    send(&socket, state)?;
    Ok(true)
}

fn send(socket: &str, state: &str) -> io::Result<()> {
    let out = UnixDatagram::unbound()?;
    match socket.strip_prefix('@') {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            out.send_to_addr(state.as_bytes(), &addr)?;
        }
        None => {
            out.send_to(state.as_bytes(), socket)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::send;
    use std::os::unix::net::UnixDatagram;

    #[test]
    fn a_state_arrives_as_one_datagram_on_a_path_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let systemd = UnixDatagram::bind(&path).unwrap();
        send(path.to_str().unwrap(), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = systemd.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
    }

    #[test]
    fn a_state_arrives_on_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("tollgate-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap();
        let systemd = UnixDatagram::bind_addr(&addr).unwrap();
        send(&format!("@{name}"), "STOPPING=1").unwrap();
        let mut buf = [0u8; 64];
        let n = systemd.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
    }
}
