//! A real etcd server for tests and examples: the `etcd` binary (Debian `etcd-server`)
//! started on free loopback ports in a temporary data dir, stopped (SIGKILL) on drop.
//!
//! The binary is `$CXC_ETCD_BIN`, else `etcd` on `PATH`, else `/usr/bin/etcd`. If none
//! exists, starting fails loudly: `scripts/install-deps.sh` installs it.
#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a (re)started server may take to report healthy.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running single-member etcd on 127.0.0.1.
pub struct EtcdServer {
    child: Option<Child>,
    dir: tempfile::TempDir,
    bin: PathBuf,
    client_port: u16,
    peer_port: u16,
    starts: u32,
}

/// The etcd binary, or a panic that says how to install it.
pub fn etcd_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("CXC_ETCD_BIN") {
        return PathBuf::from(p);
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("etcd"))
            .find(|p| p.is_file())
    });
    let bin = on_path.unwrap_or_else(|| PathBuf::from("/usr/bin/etcd"));
    assert!(
        bin.is_file(),
        "the etcd tests need a real etcd server, and no `etcd` binary was found (looked at \
         $CXC_ETCD_BIN, PATH, /usr/bin/etcd). Install it with `scripts/install-deps.sh` \
         (Debian package etcd-server), or point CXC_ETCD_BIN at an etcd 3.4+ binary."
    );
    bin
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free loopback port")
        .port()
}

impl EtcdServer {
    /// Starts a fresh server and waits until it is healthy.
    pub fn start() -> EtcdServer {
        let bin = etcd_binary();
        let dir = tempfile::Builder::new()
            .prefix("cxc-etcd-")
            .tempdir()
            .expect("temporary data dir");
        let client_port = free_port();
        let mut peer_port = free_port();
        while peer_port == client_port {
            peer_port = free_port();
        }
        let mut s = EtcdServer {
            child: None,
            dir,
            bin,
            client_port,
            peer_port,
            starts: 0,
        };
        s.spawn();
        s
    }

    /// The client URL, e.g. `http://127.0.0.1:40123`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// The data dir (kept across restarts).
    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    /// SIGKILLs the server (a crash: nothing is flushed beyond what etcd already synced)
    /// and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same data dir and ports; waits until healthy.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    fn spawn(&mut self) {
        self.starts += 1;
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::File::create(self.dir.path().join(format!("etcd-{}.log", self.starts)))
            .expect("etcd log file");
        let data = self.dir.path().join("data");
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--name")
            .arg("cxc-test")
            .arg("--data-dir")
            .arg(&data)
            .arg("--listen-client-urls")
            .arg(&client)
            .arg("--advertise-client-urls")
            .arg(&client)
            .arg("--listen-peer-urls")
            .arg(&peer)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer)
            .arg("--initial-cluster")
            .arg(format!("cxc-test={peer}"))
            // A single member: short raft timers let etcd accept 1 s lease TTLs
            // (its minimum TTL is 1.5 × the election timeout, rounded up to seconds).
            .arg("--heartbeat-interval")
            .arg("10")
            .arg("--election-timeout")
            .arg("100")
            .arg("--logger")
            .arg("zap")
            .arg("--log-level")
            .arg("warn")
            .env_remove("ETCDCTL_API")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.bin.display()));
        self.child = Some(child);
        self.wait_healthy();
    }

    fn wait_healthy(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if self.healthy() {
                return;
            }
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    panic!("etcd exited at start ({status}); log:\n{}", self.log());
                }
            }
            assert!(
                Instant::now() < deadline,
                "etcd not healthy within {START_TIMEOUT:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `GET /health` on the client port says `"health":"true"`.
    pub fn healthy(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.client_port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        if s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .is_err()
        {
            return false;
        }
        let mut body = String::new();
        let _ = s.read_to_string(&mut body);
        body.contains("\"health\":\"true\"")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("etcd-{}.log", self.starts)))
            .unwrap_or_default()
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
    }
}
