//! Real etcd servers for tests and examples: [`EtcdCluster`] starts `n` members on free
//! loopback ports in one temporary directory, each with its own data dir, and handles
//! them by pid (SIGSTOP / SIGCONT to hang and resume a member, SIGKILL to crash it);
//! [`EtcdServer`] is a cluster of one. Every member is SIGKILLed on drop.
//!
//! The binary is `$CXC_ETCD_BIN`, else `etcd` on `PATH`, else `/usr/bin/etcd`. If none
//! exists, starting fails loudly: `scripts/install-deps.sh` installs it.
#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use cxc_testkit::{Proc, all_threads_in_state, find_program, wait_until};

/// How long a (re)started cluster may take to elect a leader and report healthy.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The etcd binary, or a panic that says how to install it.
pub fn etcd_binary() -> PathBuf {
    find_program("CXC_ETCD_BIN", "etcd").unwrap_or_else(|| {
        panic!(
            "the etcd tests need a real etcd server, and no `etcd` binary was found (looked \
             at $CXC_ETCD_BIN, PATH, /usr/bin/etcd). Install it with \
             `scripts/install-deps.sh` (Debian package etcd-server), or point CXC_ETCD_BIN \
             at an etcd 3.4+ binary."
        )
    })
}

/// A free loopback port (bound, then closed).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free loopback port")
        .port()
}

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    proc: Option<Proc>,
    stopped: bool,
    starts: u32,
}

/// A running etcd cluster on 127.0.0.1.
pub struct EtcdCluster {
    members: Vec<Member>,
    dir: tempfile::TempDir,
    bin: PathBuf,
    token: String,
}

impl EtcdCluster {
    /// Starts `n` members and waits until every one is healthy (has a leader).
    pub fn start(n: usize) -> EtcdCluster {
        let bin = etcd_binary();
        let dir = tempfile::Builder::new()
            .prefix("cxc-etcd-")
            .tempdir()
            .expect("temporary dir");
        let mut ports = Vec::new();
        while ports.len() < 2 * n {
            let p = free_port();
            if !ports.contains(&p) {
                ports.push(p);
            }
        }
        let members = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: ports[2 * i],
                peer_port: ports[2 * i + 1],
                proc: None,
                stopped: false,
                starts: 0,
            })
            .collect();
        let token = format!("cxc-{}-{}", std::process::id(), ports[0]);
        let mut c = EtcdCluster {
            members,
            dir,
            bin,
            token,
        };
        for i in 0..n {
            c.spawn(i);
        }
        c.wait_healthy(&(0..n).collect::<Vec<_>>());
        c
    }

    /// The client URL of member `i`, e.g. `http://127.0.0.1:40123`.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].client_port)
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    fn proc(&self, i: usize) -> &Proc {
        self.members[i].proc.as_ref().expect("member running")
    }

    /// The pid of member `i`'s process.
    pub fn pid(&self, i: usize) -> u32 {
        self.proc(i).pid()
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&mut self, i: usize) {
        let initial = self.initial_cluster();
        let client = self.endpoint(i);
        // Raft timers: a single member elects itself at once, and short timers let etcd
        // accept 1 s lease TTLs (its minimum TTL is 1.5 × the election timeout, rounded
        // up to seconds). A cluster gets timers for a loaded 2-core machine: elections
        // after 500 ms of silence; the minimum lease TTL is then 1 s (TTLs of 2 s are
        // honoured).
        let (heartbeat, election) = if self.members.len() == 1 {
            ("10", "100")
        } else {
            ("50", "500")
        };
        let m = &mut self.members[i];
        m.starts += 1;
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let data = self.dir.path().join(format!("{}.data", m.name));
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--name")
            .arg(&m.name)
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
            .arg(&initial)
            .arg("--initial-cluster-state")
            .arg("new")
            .arg("--initial-cluster-token")
            .arg(&self.token)
            .arg("--heartbeat-interval")
            .arg(heartbeat)
            .arg("--election-timeout")
            .arg(election)
            .arg("--logger")
            .arg("zap")
            .arg("--log-level")
            .arg("warn")
            .env_remove("ETCDCTL_API");
        let what = format!("etcd member {} (start {})", m.name, m.starts);
        m.proc = Some(Proc::spawn(cmd, &what));
        m.stopped = false;
    }

    /// Waits until the members `which` are healthy (each has a leader and answers).
    ///
    /// # Panics
    ///
    /// If one exits or is not healthy in time; the message holds its log.
    pub fn wait_healthy(&mut self, which: &[usize]) {
        let deadline = Instant::now() + START_TIMEOUT;
        for &i in which {
            loop {
                if self.healthy(i) {
                    break;
                }
                let m = &mut self.members[i];
                if let Some(p) = m.proc.as_mut()
                    && let Some(status) = p.try_wait()
                {
                    panic!("etcd {} exited ({status}); log:\n{}", m.name, p.stderr());
                }
                assert!(
                    Instant::now() < deadline,
                    "etcd {} not healthy within {START_TIMEOUT:?}; log:\n{}",
                    m.name,
                    m.proc.as_ref().map(|p| p.stderr()).unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    fn http_get(&self, i: usize, path: &str) -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.members[i].client_port)).ok()?;
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .ok()?;
        let mut body = String::new();
        let _ = s.read_to_string(&mut body);
        Some(body)
    }

    /// `GET /health` of member `i` says `"health":"true"`.
    pub fn healthy(&self, i: usize) -> bool {
        !self.members[i].stopped
            && self
                .http_get(i, "/health")
                .is_some_and(|b| b.contains("\"health\":\"true\""))
    }

    /// The index of the leader (a running member whose metrics say so), waiting up to
    /// 10 s for one.
    pub fn leader(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            for (i, m) in self.members.iter().enumerate() {
                if m.proc.is_none() || m.stopped {
                    continue;
                }
                if self
                    .http_get(i, "/metrics")
                    .is_some_and(|b| b.lines().any(|l| l == "etcd_server_is_leader 1"))
                {
                    return i;
                }
            }
            assert!(Instant::now() < deadline, "no etcd leader within 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Hangs member `i` (SIGSTOP): its sockets stay open, nothing answers. Returns once
    /// every thread of the member is stopped.
    pub fn hang(&mut self, i: usize) {
        let pid = self.pid(i);
        self.proc(i).stop();
        self.members[i].stopped = true;
        assert!(
            wait_until(Duration::from_secs(5), || all_threads_in_state(pid, 'T')),
            "member {i} (pid {pid}) not stopped within 5 s of SIGSTOP"
        );
    }

    /// Resumes a hung member (SIGCONT).
    pub fn resume(&mut self, i: usize) {
        self.proc(i).cont();
        self.members[i].stopped = false;
    }

    /// SIGKILLs member `i` (a crash: nothing is flushed beyond what etcd already synced)
    /// and reaps it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.members[i].proc.take() {
            p.kill();
        }
        self.members[i].stopped = false;
    }

    /// Starts a killed member again on its data dir and ports (does not wait).
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
    }
}

/// A running single-member etcd on 127.0.0.1.
pub struct EtcdServer(EtcdCluster);

impl EtcdServer {
    /// Starts a fresh server and waits until it is healthy.
    pub fn start() -> EtcdServer {
        EtcdServer(EtcdCluster::start(1))
    }

    /// The client URL, e.g. `http://127.0.0.1:40123`.
    pub fn endpoint(&self) -> String {
        self.0.endpoint(0)
    }

    /// SIGKILLs the server and reaps it.
    pub fn kill(&mut self) {
        self.0.kill(0);
    }

    /// Starts the server again on the same data dir and ports; waits until healthy.
    pub fn restart(&mut self) {
        self.0.restart(0);
        self.0.wait_healthy(&[0]);
    }
}
