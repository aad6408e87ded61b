//! A real 3-member etcd cluster on loopback for tests: members started on free ports in
//! one temporary directory, each with its own data dir, and stopped by pid (SIGSTOP /
//! SIGCONT to hang and resume a member, SIGKILL to crash it). All members are SIGKILLed
//! on drop.
#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::server::{etcd_binary, free_port};

/// How long the cluster may take to elect a leader and report healthy.
const START_TIMEOUT: Duration = Duration::from_secs(30);

struct MemberProc {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
    stopped: bool,
    starts: u32,
}

/// A running etcd cluster on 127.0.0.1.
pub struct EtcdCluster {
    members: Vec<MemberProc>,
    dir: tempfile::TempDir,
    bin: PathBuf,
    token: String,
}

fn signal(child: &Child, sig: rustix::process::Signal) {
    let pid = i32::try_from(child.id())
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .expect("member pid");
    rustix::process::kill_process(pid, sig).expect("signal member");
}

impl EtcdCluster {
    /// Starts `n` members and waits until every one is healthy (has a leader).
    pub fn start(n: usize) -> EtcdCluster {
        let bin = etcd_binary();
        let dir = tempfile::Builder::new()
            .prefix("cxc-etcd-cluster-")
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
            .map(|i| MemberProc {
                name: format!("m{i}"),
                client_port: ports[2 * i],
                peer_port: ports[2 * i + 1],
                child: None,
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

    /// The client URL of member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].client_port)
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// The pid of member `i`'s process.
    pub fn pid(&self, i: usize) -> u32 {
        self.members[i].child.as_ref().expect("member running").id()
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
        let m = &mut self.members[i];
        m.starts += 1;
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let log =
            std::fs::File::create(self.dir.path().join(format!("{}-{}.log", m.name, m.starts)))
                .expect("etcd log file");
        let data = self.dir.path().join(format!("{}.data", m.name));
        let child = Command::new(&self.bin)
            .arg("--name")
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
            // Raft timers for a loaded 2-core machine: elections after 500 ms of
            // silence; the minimum lease TTL is then 1 s (TTLs of 2 s are honoured).
            .arg("--heartbeat-interval")
            .arg("50")
            .arg("--election-timeout")
            .arg("500")
            .arg("--logger")
            .arg("zap")
            .arg("--log-level")
            .arg("warn")
            .env_remove("ETCDCTL_API")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.bin.display()));
        m.child = Some(child);
        m.stopped = false;
    }

    /// Waits until the members `which` are healthy (each has a leader and answers).
    pub fn wait_healthy(&mut self, which: &[usize]) {
        let deadline = Instant::now() + START_TIMEOUT;
        for &i in which {
            loop {
                if self.healthy(i) {
                    break;
                }
                if let Some(c) = self.members[i].child.as_mut() {
                    if let Ok(Some(status)) = c.try_wait() {
                        panic!("etcd member {i} exited ({status})");
                    }
                }
                assert!(
                    Instant::now() < deadline,
                    "etcd member {i} not healthy within {START_TIMEOUT:?}"
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
            for i in 0..self.members.len() {
                if self.members[i].child.is_none() || self.members[i].stopped {
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
    /// every thread of the member is stopped (`kill` only starts the group stop: a
    /// thread that is running may still serve a request for a moment).
    pub fn hang(&mut self, i: usize) {
        let pid = self.pid(i);
        signal(
            self.members[i].child.as_ref().expect("member running"),
            rustix::process::Signal::STOP,
        );
        self.members[i].stopped = true;
        let deadline = Instant::now() + Duration::from_secs(5);
        while !all_threads_stopped(pid) {
            assert!(
                Instant::now() < deadline,
                "member {i} (pid {pid}) not stopped within 5 s of SIGSTOP"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Resumes a hung member (SIGCONT).
    pub fn resume(&mut self, i: usize) {
        signal(
            self.members[i].child.as_ref().expect("member running"),
            rustix::process::Signal::CONT,
        );
        self.members[i].stopped = false;
    }

    /// SIGKILLs member `i` and reaps it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.members[i].stopped = false;
    }

    /// Starts a killed member again on its data dir and ports (does not wait).
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
    }
}

/// Whether every thread of `pid` is in the stopped state (`T` in `/proc/PID/task/*/stat`).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut any = false;
    for t in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            return false;
        };
        // The state follows the parenthesised command name.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        if state != Some('T') {
            return false;
        }
        any = true;
    }
    any
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
