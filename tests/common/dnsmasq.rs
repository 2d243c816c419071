//! A real DNS server (Debian's `dnsmasq`, package dnsmasq-base) on a free port of 127.0.0.1, answering only the records a test gives it.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct Dnsmasq {
    pub addr: SocketAddr,
    child: Child,
}

impl Dnsmasq {
    /// Serves `ptr` (address → name) and `a` (name → address) records and
    /// nothing else (no upstream, no /etc/hosts).
    pub fn start(ptr: &[(&str, &str)], a: &[(&str, &str)]) -> Dnsmasq {
        let binary = "/usr/sbin/dnsmasq";
        assert!(
            std::path::Path::new(binary).exists(),
            "dnsmasq is not installed: these tests need it (.ci/test installs dnsmasq-base)"
        );
        let addr = super::free_addr();
        let mut cmd = Command::new(binary);
        cmd.args([
            "--no-daemon",
            "--bind-interfaces",
            "--listen-address=127.0.0.1",
            "--no-resolv",
            "--no-hosts",
            "--conf-file=/dev/null",
            "--pid-file=",
        ])
        .arg(format!("--port={}", addr.port()));
        for (ip, name) in ptr {
            let o: Vec<&str> = ip.split('.').rev().collect();
            cmd.arg(format!("--ptr-record={}.in-addr.arpa,{name}", o.join(".")));
        }
        for (name, ip) in a {
            cmd.arg(format!("--host-record={name},{ip}"));
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("dnsmasq starts");
        let d = Dnsmasq { addr, child };
        // Ready once it answers (REFUSED for a name it does not hold).
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let probe =
            b"\x00\x01\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x05probe\x00\x00\x01\x00\x01";
        for _ in 0..100 {
            let _ = socket.send_to(probe, addr);
            let mut buf = [0u8; 512];
            if socket.recv(&mut buf).is_ok() {
                return d;
            }
        }
        panic!("dnsmasq did not answer on {addr}");
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
