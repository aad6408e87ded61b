//! Leader election on the mapped file with real processes: a SIGKILLed leader, a
//! SIGSTOPped leader, and a leader whose work loop stops renewing are replaced by a
//! standby; the deposed leader sees the loss and its fenced writes are refused. Every
//! run checks the fenced file's log: in acceptance order the tokens never go down (no
//! two leaders' accepted writes interleave), and each new term's token is larger.

use std::time::{Duration, Instant};

use cxc_sync::{
    ElectionBackend, ElectionConfig, ElectionError, Elector, FencedFile, FencedResource,
    MmapElection,
};
use cxc_testkit::{Proc, RoleCommand, arg, fields, in_role, mono_ns, path_arg, report, try_arg};

fn ms_arg(key: &str) -> Option<Duration> {
    try_arg(key).map(|v| Duration::from_millis(v.to_string_lossy().parse().expect("ms")))
}

/// A candidate: campaigns; while leading, appends `token id seq` to the fenced file and
/// then renews, every 5 ms. With `stall_after`, its work loop stops (no write, no renew)
/// for `stall_for` once it has led that long. Reports `leading`, `refused`, `lost`;
/// exits after the loss.
fn candidate() {
    let lease = ms_arg("lease_ms").expect("lease_ms");
    let id = arg("id");
    let backend = MmapElection::create_or_open(path_arg("path"), lease).expect("election");
    let cfg = ElectionConfig::new(id.clone())
        .lease_duration(lease)
        .retry_period(Duration::from_millis(20));
    let el = Elector::new(backend, cfg).expect("elector");
    let res = FencedFile::open(path_arg("res")).expect("fenced file");
    let mut stall = ms_arg("stall_after").zip(ms_arg("stall_for"));
    let rejoin = try_arg("rejoin").is_some();
    loop {
        let l = el
            .campaign(Duration::from_secs(60))
            .expect("campaign")
            .expect("elected within 60 s");
        let token = l.token();
        log_event("leading", token);
        report(format!("event=leading token={token} t={}", mono_ns()));
        let started = Instant::now();
        for seq in 0u64.. {
            if let Some((after, hold)) = stall
                && started.elapsed() >= after
            {
                std::thread::sleep(hold);
                stall = None;
            }
            let line = format!("{token} {id} {seq}\n");
            if !res.append(token, line.as_bytes()).expect("append") {
                report(format!("event=refused token={token} t={}", mono_ns()));
            }
            match l.renew() {
                Ok(()) => {}
                Err(ElectionError::Lost { .. }) => {
                    // A deposed leader that writes anyway (stopped between its write
                    // and its renewal, it learns of the loss first) is refused.
                    let line = format!("{token} {id} late\n");
                    if !res.append(token, line.as_bytes()).expect("append") {
                        report(format!("event=refused token={token} t={}", mono_ns()));
                    }
                    report(format!("event=lost token={token} t={}", mono_ns()));
                    break;
                }
                Err(e) => panic!("renew: {e}"),
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if !rejoin {
            return;
        }
    }
}

/// Appends `event token t` to the run's shared event log (`O_APPEND`: one line per
/// write, whole).
fn log_event(event: &str, token: u64) {
    use std::io::Write;
    let Some(path) = try_arg("events") else {
        return;
    };
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("event log");
    f.write_all(format!("{event} {token} {}\n", mono_ns()).as_bytes())
        .expect("event");
}

struct Run {
    dir: tempfile::TempDir,
}

impl Run {
    fn new() -> Self {
        Run {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn spawn(&self, test: &str, id: &str, lease_ms: u64, extra: &[(&str, &str)]) -> Proc {
        let mut c = RoleCommand::new(test, "candidate")
            .arg("path", self.dir.path().join("election"))
            .arg("res", self.dir.path().join("resource"))
            .arg("id", id)
            .arg("lease_ms", lease_ms.to_string());
        for (k, v) in extra {
            c = c.arg(k, v);
        }
        c.spawn()
    }

    /// The fenced file's log, checked: tokens never decrease in acceptance order.
    fn check_log(&self) -> Vec<u64> {
        let (mark, data) = FencedFile::open(self.dir.path().join("resource"))
            .unwrap()
            .read()
            .unwrap();
        let text = String::from_utf8(data).unwrap();
        let tokens: Vec<u64> = text
            .lines()
            .map(|l| l.split(' ').next().unwrap().parse().unwrap())
            .collect();
        assert!(
            tokens.windows(2).all(|w| w[0] <= w[1]),
            "accepted writes of two leaders interleave: {tokens:?}"
        );
        // A leader killed between raising the mark and writing its line leaves the mark
        // above the last line's token (`FencedFile` raises the mark first, so that no
        // older token can write after it); never below.
        let last = tokens.last().copied().unwrap_or(0);
        assert!(
            last <= mark,
            "the last accepted line ({last}) is above the mark ({mark})"
        );
        let mut terms = tokens.clone();
        terms.dedup();
        terms
    }
}

/// Whether `pid` holds a `flock` (from `/proc/locks`).
fn holds_flock(pid: u32) -> bool {
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    locks.lines().any(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        w.get(1) == Some(&"FLOCK") && w.get(4) == Some(&pid.to_string().as_str())
    })
}

/// The next report of `event`, skipping reports of other events.
fn expect(p: &mut Proc, event: &str, timeout: Duration) -> (u64, u64) {
    loop {
        let r = p.next_report(timeout);
        let f = fields(&r);
        if f.get("event").copied() == Some(event) {
            return (f["token"].parse().unwrap(), f["t"].parse().unwrap());
        }
    }
}

fn wait_leader_wrote(run: &Run, token: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !run.check_log().contains(&token) {
        assert!(Instant::now() < deadline, "leader {token} never wrote");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The standby campaigns from the start; the leader is SIGKILLed: the standby leads
/// well within the lease duration (the OS proves the leader dead), with a higher token.
#[test]
fn sigkilled_leader_is_replaced_at_once() {
    const T: &str = "sigkilled_leader_is_replaced_at_once";
    if in_role("candidate") {
        return candidate();
    }
    let mut worst = Duration::ZERO;
    for round in 0..3 {
        let run = Run::new();
        let mut a = run.spawn(T, "a", 1000, &[]);
        let (ta, _) = expect(&mut a, "leading", Duration::from_secs(20));
        let mut b = run.spawn(T, "b", 1000, &[]);
        wait_leader_wrote(&run, ta);
        std::thread::sleep(Duration::from_millis(100)); // b is blocked campaigning
        let killed = mono_ns();
        a.kill();
        let (tb, t) = expect(&mut b, "leading", Duration::from_secs(20));
        let took = Duration::from_nanos(t.saturating_sub(killed));
        eprintln!("round {round}: SIGKILL failover {took:?} (lease 1 s)");
        worst = worst.max(took);
        assert!(tb > ta);
        wait_leader_wrote(&run, tb);
        assert_eq!(run.check_log(), vec![ta, tb]);
    }
    assert!(
        worst < Duration::from_millis(500),
        "failover took {worst:?}"
    );
}

/// A SIGSTOPped leader is replaced after the lease duration; continued, its next write
/// is refused and it sees the loss.
#[test]
fn sigstopped_leader_is_replaced_and_fenced() {
    const T: &str = "sigstopped_leader_is_replaced_and_fenced";
    if in_role("candidate") {
        return candidate();
    }
    let lease = 200;
    let run = Run::new();
    let mut a = run.spawn(T, "a", lease, &[]);
    let (ta, _) = expect(&mut a, "leading", Duration::from_secs(20));
    let mut b = run.spawn(T, "b", lease, &[]);
    wait_leader_wrote(&run, ta);
    // A process stopped inside a fenced-file operation holds its flock and blocks every
    // writer until it runs again (see docs/leader-election.md); stop it outside one.
    let stopped = loop {
        let t = mono_ns();
        a.stop();
        if !holds_flock(a.pid()) {
            break t;
        }
        a.cont();
        std::thread::sleep(Duration::from_millis(1));
    };
    let (tb, t) = expect(&mut b, "leading", Duration::from_secs(20));
    let took = Duration::from_nanos(t.saturating_sub(stopped));
    eprintln!("SIGSTOP failover {took:?} (lease {lease} ms)");
    // The lease runs from a's last renewal, which came up to one loop (5 ms, more on a
    // loaded machine) before the stop.
    assert!(
        took >= Duration::from_millis(lease - 50),
        "replaced {took:?} after the stop, before the lease ran out"
    );
    assert!(
        took < Duration::from_millis(lease + 500),
        "replaced after {took:?}"
    );
    assert!(tb > ta);
    wait_leader_wrote(&run, tb);
    a.cont();
    expect(&mut a, "refused", Duration::from_secs(20));
    expect(&mut a, "lost", Duration::from_secs(20));
    a.finish(Duration::from_secs(20));
    assert_eq!(run.check_log(), vec![ta, tb]);
}

/// A leader whose work loop stops renewing (its process alive and running) is replaced;
/// when its loop resumes, its write is refused and it sees the loss.
#[test]
fn leader_that_stops_renewing_loses_while_alive() {
    const T: &str = "leader_that_stops_renewing_loses_while_alive";
    if in_role("candidate") {
        return candidate();
    }
    let lease = 200;
    let run = Run::new();
    let mut a = run.spawn(
        T,
        "a",
        lease,
        &[("stall_after", "100"), ("stall_for", "700")],
    );
    let (ta, _) = expect(&mut a, "leading", Duration::from_secs(20));
    let mut b = run.spawn(T, "b", lease, &[]);
    let (tb, _) = expect(&mut b, "leading", Duration::from_secs(20));
    assert!(tb > ta);
    // a's process lives all along: it resumes, is refused, sees the loss, exits cleanly.
    expect(&mut a, "refused", Duration::from_secs(20));
    expect(&mut a, "lost", Duration::from_secs(20));
    a.finish(Duration::from_secs(20));
    wait_leader_wrote(&run, tb);
    assert_eq!(run.check_log(), vec![ta, tb]);
}

/// Churn: three candidates that campaign again after a loss; the current leader is
/// SIGKILLed (and replaced by a new candidate), SIGSTOPped past the lease and continued,
/// or left alone, 16 times. Over all terms: the fenced log's tokens never go down, and
/// ordered by election time every term's token is larger than the one before.
#[test]
fn churn_keeps_one_fenced_leader_at_a_time() {
    const T: &str = "churn_keeps_one_fenced_leader_at_a_time";
    if in_role("candidate") {
        return candidate();
    }
    let lease = 100;
    let run = Run::new();
    let events = run.dir.path().join("events");
    let ev = events.to_string_lossy().into_owned();
    let extra = [("rejoin", "1"), ("events", ev.as_str())];
    let mut kids: Vec<(String, Proc)> = (0..3)
        .map(|i| {
            let id = format!("c{i}");
            let p = run.spawn(T, &id, lease, &extra);
            (id, p)
        })
        .collect();
    let observer = MmapElection::create_or_open(
        run.dir.path().join("election"),
        Duration::from_millis(lease),
    )
    .unwrap();
    let mut rng = cxc_testkit::Rng::for_test();
    let mut next_id = 3;
    let (mut kills, mut stops) = (0, 0);
    for _ in 0..16 {
        std::thread::sleep(Duration::from_millis(rng.range(50, 200)));
        let Some(leader) = observer.leader().unwrap() else {
            continue;
        };
        let Some(i) = kids.iter().position(|(id, _)| *id == leader.identity) else {
            continue;
        };
        match rng.below(3) {
            0 => {
                kids[i].1.kill();
                kills += 1;
                let id = format!("c{next_id}");
                next_id += 1;
                let p = run.spawn(T, &id, lease, &extra);
                kids[i] = (id, p);
            }
            1 => {
                let p = &kids[i].1;
                p.stop();
                if holds_flock(p.pid()) {
                    p.cont();
                    continue;
                }
                stops += 1;
                std::thread::sleep(Duration::from_millis(lease + rng.range(20, 150)));
                p.cont();
            }
            _ => {}
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    for (_, p) in &mut kids {
        p.kill();
    }
    let terms = run.check_log();
    let log = std::fs::read_to_string(&events).unwrap();
    let mut elected: Vec<(u64, u64)> = log
        .lines()
        .map(|l| {
            let w: Vec<&str> = l.split(' ').collect();
            assert_eq!(w[0], "leading");
            (w[2].parse().unwrap(), w[1].parse().unwrap())
        })
        .collect();
    elected.sort();
    assert!(
        elected.windows(2).all(|w| w[0].1 < w[1].1),
        "tokens by election time: {elected:?}"
    );
    eprintln!(
        "churn: {} terms elected, {} wrote, {kills} kills, {stops} stops",
        elected.len(),
        terms.len()
    );
    assert!(elected.len() >= 2 + kills);
}

/// A backend that always lets its caller lead and counts renewals in a file (no lease, so
/// no sentinel thread in the process: only the renewer itself can look).
struct CountingBackend(std::path::PathBuf);

impl ElectionBackend for CountingBackend {
    type Term = u64;
    type Error = std::io::Error;
    fn try_lead(&self, _: &str) -> Result<Option<u64>, Self::Error> {
        Ok(Some(1))
    }
    fn lead_timeout(&self, _: &str, _: Duration) -> Result<Option<u64>, Self::Error> {
        Ok(Some(1))
    }
    fn renew(&self, _: &u64) -> Result<bool, Self::Error> {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.0)?;
        f.write_all(b".")?;
        Ok(true)
    }
    fn is_current(&self, _: &u64) -> Result<bool, Self::Error> {
        Ok(true)
    }
    fn resign(&self, _: &u64) -> Result<bool, Self::Error> {
        Ok(true)
    }
    fn leader(&self) -> Result<Option<cxc_sync::Leader>, Self::Error> {
        Ok(None)
    }
    fn wait_lost(&self, _: &u64, timeout: Duration) -> Result<bool, Self::Error> {
        std::thread::sleep(timeout);
        Ok(false)
    }
    fn token(term: &u64) -> u64 {
        *term
    }
}

/// A leader with a background renewer whose main thread exited (the `pthread_exit`
/// pattern) and whose last own thread then ended, without resigning: no thread of the
/// application is left, only the library's renewer (and, on the lease file, its
/// sentinel). The process must end as a process does when its last thread ends (status
/// 0) instead of leading for ever, and the next candidate then leads. Once on the lease
/// file, once on a backend without a lease (no sentinel: the renewer looks itself).
#[test]
fn a_leader_whose_own_threads_all_ended_is_not_kept_alive_by_its_renewer() {
    const T: &str = "a_leader_whose_own_threads_all_ended_is_not_kept_alive_by_its_renewer";
    if in_role("bg_leader") {
        let lease = Duration::from_millis(300);
        let cfg = ElectionConfig::new(arg("id"))
            .lease_duration(lease)
            .renewal(cxc_sync::Renewal::Background);
        let path = path_arg("path");
        let leader: Box<dyn std::any::Any> = if try_arg("counting").is_some() {
            let el = Elector::new(CountingBackend(path), cfg).expect("elector");
            let l = el.campaign(Duration::from_secs(10)).unwrap().unwrap();
            Box::new((el, l))
        } else {
            let b = MmapElection::create_or_open(path, lease).expect("election");
            let el = Elector::new(b, cfg).expect("elector");
            let l = el.campaign(Duration::from_secs(10)).unwrap().unwrap();
            Box::new((el, l))
        };
        assert!(cxc_testkit::exit_main_thread());
        report("leading");
        // This (the test's) thread ends here leading: the process's last own thread.
        std::mem::forget(leader);
        return;
    }
    for counting in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir
            .path()
            .join(if counting { "renewals" } else { "election" });
        let mut c = RoleCommand::new(T, "bg_leader")
            .arg("path", &path)
            .arg("id", "bg");
        if counting {
            c = c.arg("counting", "1");
        }
        let mut kid = c.spawn();
        assert_eq!(kid.next_report(Duration::from_secs(20)), "leading");
        let status = kid.wait_timeout(Duration::from_secs(5));
        assert!(
            status.is_some_and(|s| s.success()),
            "counting={counting}: the leader's process did not end when its last own thread did: {status:?}"
        );
        if counting {
            // Renewals stopped with it.
            let n = std::fs::metadata(&path).map_or(0, |m| m.len());
            std::thread::sleep(Duration::from_millis(400));
            assert_eq!(std::fs::metadata(&path).map_or(0, |m| m.len()), n);
        } else {
            let b = MmapElection::create_or_open(&path, Duration::from_millis(300)).unwrap();
            let el = Elector::new(b, ElectionConfig::new("next")).unwrap();
            assert!(
                el.campaign(Duration::from_secs(2)).unwrap().is_some(),
                "the ended leader still leads"
            );
        }
    }
}
