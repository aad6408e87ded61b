//! Attack round 35 on the etcd backend (docs/etcd.md), with a real 3-member etcd cluster
//! on loopback: a HOLDER PROCESS (re-executed test binary in a role) SIGSTOPped at
//! chosen moments around its session's renewals (keep-alive), and etcd members
//! SIGSTOPped while a holder's renewal is due. The judges are independent of the
//! library's own loss bookkeeping where they can be: mono-clock instants written by the
//! holder (each check's instant taken *before* the check) against the instant a rival
//! in the parent was given the claim or permit, the rival's fencing tokens, and etcd's
//! keys read with a raw request.
//!
//! 1. `a_holder_stopped_around_its_renewals_never_believes_after_a_rival_took_over`:
//!    the holder (lease claim + permit of a pool of 1, TTL 2 s) is SIGSTOPped at an
//!    offset after an observed refresh (just before the next renewal is due, and
//!    mid-period) for 0.6 × TTL, 1.1 × TTL (resumed inside etcd's lazy-expiry window)
//!    and 1.3 × TTL, while a rival polls. Outcome: HELD (5 of 5 runs): no `is_lost`,
//!    `is_current` or `read` that started after the rival was given the claim or the
//!    permit said "held"; a lost claim never came back; the stale write and give were
//!    refused; tokens strictly increased over every round.
//! 2. `a_claim_in_flight_across_the_ttl_is_not_returned_as_held`: the holder's
//!    `try_claim` is in flight (sent to a follower that is hung, so it is applied only
//!    once the follower resumes) when the holder is SIGSTOPped; the claim is applied,
//!    the holder's session expires during the stop, a rival acquires the lease, then the
//!    holder is continued. Outcome: BROKE 3 of 3 runs: `try_claim` returned
//!    `Ok(Some(claim))` although the rival held the lease (`FencedLease::try_claim`:
//!    "`Ok(None)` if someone else holds it"); only `is_lost(&claim)` (true at once) told
//!    the holder. Cause: `Contender::attempt_on` (crates/cxc-etcd/src/contend.rs)
//!    returned `First` when the response said our key was first, without looking at the
//!    session after the response (its local deadline had passed while the response sat
//!    unread). FIXED: a first place whose session is no longer alive ends the session
//!    and counts as "not first" (the claim and the election's campaign share the path);
//!    passes 3 of 3 runs.
//! 3. `a_member_hung_while_the_renewal_is_due_costs_no_claim`: the holder prefers a
//!    member that is SIGSTOPped just before the holder's renewal is due: a follower for
//!    1.5 s (TTL 2 s), then the leader for 1.2 s (TTL 4 s, below the T − T/3 of etcd
//!    issue #15247). Outcome: HELD (no loss reported, the claim and permit still current
//!    after, the rival on the healthy members given nothing; longest refresh gap 1.0 s
//!    of 2 s, 2.0 s of 4 s). About one run in ten on a loaded machine failed with the
//!    rival given the permit: the test's own race (the rival kept polling while the
//!    holder, told to finish, gave its permit back as it exited; the grant came 21 ms
//!    after the holder's last check). The rival now stops before the holder is told to
//!    finish.
//!
//! Not done in the time box: a holder SIGSTOPped mid-`write` at random instants (a write
//! applied before the stop and answered after the TTL returns `Ok(true)`, which the docs
//! allow: it was linearized while the claim was current), and the permit counterpart of
//! attack 2 (a take is a count then a transaction, so the hung-follower trick stops the
//! holder before the transaction is sent).

mod common;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{
    EtcdCluster, StopOnDrop, child, connect, keys_under, mono_ns, others, patiently, serial,
    starting_with,
};
use cxc_etcd::{EtcdLease, EtcdSemaphore, FencedLease, KeepAlive};
use cxc_testkit::{Proc, arg, child_wait_for_path, fields, path_arg, report, wait_until};

/// If this process is a child, plays its role and exits.
fn child_dispatch() {
    cxc_testkit::play_role!(role_holder, role_inflight_claimer);
}

fn endpoints_arg() -> Vec<String> {
    arg("endpoints").split(',').map(str::to_owned).collect()
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

// ---------------------------------------------------------------------------------------
// the holder role (attacks 1 and 3)
// ---------------------------------------------------------------------------------------

/// Acquires the lease `<key>/lease` and a permit of `<key>/pool` (max 1), TTL `ttl_ms`,
/// background keep-alive, on `endpoints` (in that order of preference); writes the
/// payload; reports `ready gen= token=`, then `refresh at=NS` the first time it sees
/// the lease's session refreshed. Then checks in a loop until `<dir>/done`: `is_lost`
/// of claim and permit, and (a request) `is_current` of the claim; each check's instant
/// is taken before it. Reports the last instant each said "held", the first instant a
/// loss check said lost, whether a claim said lost ever said held again, and what its
/// fenced operations do afterwards. Drops its handles (revoking its sessions) and exits.
fn role_holder() {
    let ttl = Duration::from_millis(arg("ttl_ms").parse().expect("ttl_ms"));
    let etcd = connect(
        &endpoints_arg(),
        ttl,
        KeepAlive::Background,
        Duration::from_secs(1),
    );
    let key = arg("key");
    let lease = EtcdLease::new(&etcd, &format!("{key}/lease"), 0u64).expect("lease");
    let pool = EtcdSemaphore::open(&etcd, &format!("{key}/pool"), 1).expect("pool");
    let claim = patiently("acquire", Duration::from_secs(20), || {
        lease.acquire(Duration::from_secs(10))
    })
    .expect("the lease never came free");
    let permit = patiently("take", Duration::from_secs(20), || {
        pool.take_permit(Duration::from_secs(10))
    })
    .expect("the permit never came free");
    let v = patiently("read", Duration::from_secs(10), || lease.read(&claim)).expect("current");
    assert!(lease.write(&claim, v + 1).expect("write"), "holder's write");
    report(format!(
        "ready gen={} token={}",
        claim.generation(),
        permit.token()
    ));
    let done = path_arg("dir").join("done");
    let base = lease.keep_alive_stats().refreshes;
    let mut refresh_reported = false;
    let (mut l_ok, mut p_ok, mut c_ok) = (0u64, 0u64, 0u64);
    let (mut l_lost, mut p_lost) = (0u64, 0u64);
    let mut resurrected = false;
    let mut checks = 0u64;
    let mut errors = 0u64;
    while !done.exists() {
        if !refresh_reported && lease.keep_alive_stats().refreshes > base {
            refresh_reported = true;
            report(format!("refresh at={}", mono_ns()));
        }
        let before = mono_ns();
        if lease.is_lost(&claim) {
            if l_lost == 0 {
                l_lost = before;
            }
        } else {
            l_ok = before;
            if l_lost != 0 {
                resurrected = true;
            }
        }
        let before = mono_ns();
        if pool.is_lost(&permit) {
            if p_lost == 0 {
                p_lost = before;
            }
        } else {
            p_ok = before;
            if p_lost != 0 {
                resurrected = true;
            }
        }
        let before = mono_ns();
        match lease.is_current(&claim) {
            Ok(true) => c_ok = before,
            Ok(false) => {}
            Err(_) => errors += 1,
        }
        checks += 1;
        std::thread::sleep(Duration::from_millis(2));
    }
    let s = |r: Result<bool, cxc_etcd::EtcdError>| match r {
        Ok(v) => v.to_string(),
        Err(e) => format!("err:{}", format!("{e}").replace(' ', "_")),
    };
    let current = s(lease.is_current(&claim));
    let pcurrent = s(pool.is_current(&permit));
    let read = match lease.read(&claim) {
        Ok(Some(_)) => "some".to_owned(),
        Ok(None) => "none".to_owned(),
        Err(e) => format!("err:{}", format!("{e}").replace(' ', "_")),
    };
    let write = if current == "true" {
        "skipped".to_owned()
    } else {
        s(lease.write(&claim, 999))
    };
    let give = if pcurrent == "true" {
        "skipped".to_owned()
    } else {
        s(pool.give_permit(&permit))
    };
    let ka = lease.keep_alive_stats();
    report(format!(
        "after lease_ok={l_ok} permit_ok={p_ok} current_ok={c_ok} lease_lost={l_lost} \
         permit_lost={p_lost} resurrected={resurrected} checks={checks} errors={errors} \
         current={current} pcurrent={pcurrent} read={read} write={write} give={give} \
         max_gap_ms={} failed_attempts={}",
        ka.max_gap.as_millis(),
        ka.failed_attempts
    ));
}

/// What the holder reported after the round.
struct After(String);

impl After {
    fn num(&self, k: &str) -> u64 {
        fields(&self.0)[k].parse().expect(k)
    }
    fn get(&self, k: &str) -> String {
        fields(&self.0)[k].to_owned()
    }
}

/// What a rival was given: `(claim (at, gen), permit (at, token))`.
type Given = (Option<(u64, u64)>, Option<(u64, u64)>);

/// A rival in the parent on its own connection: polls `try_claim` and `try_take_permit`
/// every 20 ms until `stop`, recording the instant each was first given (after the call
/// returned, so the grant was applied before it).
struct Rival {
    lease: EtcdLease<u64>,
    pool: EtcdSemaphore,
    got: Mutex<Given>,
    claim: Mutex<Option<cxc_etcd::EtcdClaim>>,
    permit: Mutex<Option<cxc_etcd::EtcdPermit>>,
}

impl Rival {
    fn new(etcd: &cxc_etcd::Etcd, key: &str) -> Rival {
        Rival {
            lease: EtcdLease::new(etcd, &format!("{key}/lease"), 0u64).expect("lease"),
            pool: EtcdSemaphore::open(etcd, &format!("{key}/pool"), 1).expect("pool"),
            got: Mutex::new((None, None)),
            claim: Mutex::new(None),
            permit: Mutex::new(None),
        }
    }

    fn poll(&self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            let need_claim = self.claim.lock().unwrap().is_none();
            if need_claim && let Ok(Some(c)) = self.lease.try_claim() {
                let at = mono_ns();
                *self.claim.lock().unwrap() = Some(c);
                self.got.lock().unwrap().0 = Some((at, c.generation()));
            }
            let need_permit = self.permit.lock().unwrap().is_none();
            if need_permit && let Ok(Some(p)) = self.pool.try_take_permit() {
                let at = mono_ns();
                self.got.lock().unwrap().1 = Some((at, p.token()));
                *self.permit.lock().unwrap() = Some(p);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Gives back what it got, so the next round's holder can take it.
    fn give_back(&self) {
        if let Some(c) = self.claim.lock().unwrap().take() {
            assert!(self.lease.is_current(&c).expect("rival current"));
            assert!(self.lease.release(&c).expect("rival release"));
        }
        if let Some(p) = self.permit.lock().unwrap().take() {
            assert!(self.pool.is_current(&p).expect("rival permit current"));
            assert!(self.pool.give_permit(&p).expect("rival give"));
        }
        *self.got.lock().unwrap() = (None, None);
    }
}

/// What the parent does to the system once the holder's refresh was seen: SIGSTOP the
/// holder, or hang an etcd member.
enum Freeze {
    Holder,
    Member(usize),
}

/// One round: a holder child on `holder_eps`; after its first observed refresh, waits
/// `offset`, freezes `what` for `hold`, resumes, lets it check 800 ms more. The rival
/// polls throughout. Returns the holder's `ready` and `after` reports and what the
/// rival got: `(claim (at, gen), permit (at, token))`.
#[allow(clippy::too_many_arguments)]
fn round(
    test: &str,
    cluster: &mut EtcdCluster,
    holder_eps: &[String],
    rival: &Rival,
    key: &str,
    ttl: Duration,
    offset: Duration,
    hold: Duration,
    what: Freeze,
) -> (String, After, Given) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut kid: Proc = child(test, "holder", &holder_eps[0], key)
        .arg("endpoints", holder_eps.join(","))
        .arg("ttl_ms", ttl.as_millis().to_string())
        .arg("dir", dir.path())
        .spawn();
    let ready = kid.next_report(Duration::from_secs(60));
    let refresh = kid.next_report(Duration::from_secs(30));
    let at: u64 = fields(refresh.strip_prefix("refresh ").expect("refresh report"))["at"]
        .parse()
        .expect("at");
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        // A panic below ends the rival's polling instead of leaving the scope waiting.
        let stopper = StopOnDrop(&stop);
        let polling = s.spawn(|| rival.poll(&stop));
        let target = at + offset.as_nanos() as u64;
        let now = mono_ns();
        if target > now {
            std::thread::sleep(Duration::from_nanos(target - now));
        }
        match what {
            Freeze::Holder => {
                kid.stop();
                kid.wait_state('T', Duration::from_secs(5));
            }
            Freeze::Member(i) => cluster.hang(i),
        }
        std::thread::sleep(hold);
        match what {
            Freeze::Holder => kid.cont(),
            Freeze::Member(i) => cluster.resume(i),
        }
        std::thread::sleep(Duration::from_millis(800));
        // The rival stops before the holder is told to finish: the holder gives its
        // claim and permit back as it exits, and a grant after that is no finding.
        drop(stopper);
        polling.join().expect("rival");
        std::fs::write(dir.path().join("done"), "").expect("done");
        let after = kid.next_report(Duration::from_secs(30));
        kid.finish(Duration::from_secs(30));
        let got = *rival.got.lock().unwrap();
        (
            ready,
            After(after.strip_prefix("after ").expect("after").to_owned()),
            got,
        )
    })
}

/// The holder process is SIGSTOPped at an offset after an observed renewal of its
/// session (TTL 2 s, renewal every T/3 = 667 ms): just before the next renewal is due
/// (600 ms) for 0.6 × TTL and for 1.3 × TTL, and mid-period (300 ms) for 1.1 × TTL
/// (resumed while etcd, which checks expiry every 500 ms, may not have expired it yet).
/// A rival in the parent polls `try_claim` / `try_take_permit` every 20 ms.
/// docs/etcd.md: "Because the local deadline never comes after etcd's expiry, a holder's
/// own loss check says "lost" by the time anyone else can be given its permit or claim
/// when the session **expires**"; `is_lost` "once lost, always lost"; "A stale claim
/// cannot act ... a paused process that wakes up after its TTL is refused by etcd
/// itself"; "Generations strictly increase". Judged: no check (`is_lost` of claim and
/// permit, `is_current` of the claim) that *started* after the rival was given the claim
/// or permit said "held"; no loss check said held after saying lost; if the rival got
/// them the holder's write and give are refused and its read is `None`; if it did not,
/// the holder still holds; fencing tokens strictly increase over all rounds.
#[test]
fn a_holder_stopped_around_its_renewals_never_believes_after_a_rival_took_over() {
    child_dispatch();
    let _one = serial();
    let mut cluster = EtcdCluster::start(3);
    let eps = cluster.endpoints();
    let ttl = Duration::from_secs(2);
    let t = "a_holder_stopped_around_its_renewals_never_believes_after_a_rival_took_over";
    let key = "r35s";
    let etcd = connect(&eps, ttl, KeepAlive::Background, Duration::from_secs(1));
    let rival = Rival::new(&etcd, key);
    let mut gens: Vec<u64> = Vec::new();
    let mut toks: Vec<u64> = Vec::new();
    let mut wrong = Vec::new();
    let plan = [
        (600u64, 1200u64), // just before the renewal, shorter than the TTL
        (600, 2600),       // just before the renewal, longer than the TTL
        (300, 2200),       // mid-period, just past the TTL (etcd's lazy expiry)
    ];
    for (k, &(off, hold)) in plan.iter().enumerate() {
        let hep = starting_with(&cluster, k % 3);
        let (ready, after, (gl, gp)) = round(
            t,
            &mut cluster,
            &hep,
            &rival,
            key,
            ttl,
            Duration::from_millis(off),
            Duration::from_millis(hold),
            Freeze::Holder,
        );
        let f = fields(&ready);
        let (hg, ht): (u64, u64) = (
            f["gen"].parse().expect("gen"),
            f["token"].parse().expect("token"),
        );
        eprintln!(
            "attack35 round {k} (stop at +{off} ms for {hold} ms): holder gen={hg} token={ht}; \
             rival claim={gl:?} permit={gp:?}; holder {}",
            after.0
        );
        gens.push(hg);
        toks.push(ht);
        if after.get("resurrected") != "false" {
            wrong.push(format!(
                "round {k}: a loss check said held after it said lost"
            ));
        }
        match gl {
            Some((at, g)) => {
                gens.push(g);
                for kk in ["lease_ok", "current_ok"] {
                    let ok = after.num(kk);
                    if ok >= at {
                        wrong.push(format!(
                            "round {k}: holder's {kk} check started {:.1} ms after the rival \
                             was given the claim (gen {g}) and said held",
                            ms(ok - at)
                        ));
                    }
                }
                for (kk, want) in [("current", "false"), ("read", "none"), ("write", "false")] {
                    if after.get(kk) != want {
                        wrong.push(format!("round {k}: stale {kk} = {}", after.get(kk)));
                    }
                }
            }
            None => {
                if after.get("current") != "true" {
                    wrong.push(format!(
                        "round {k}: the rival got no claim but the holder's is_current = {}",
                        after.get("current")
                    ));
                }
            }
        }
        match gp {
            Some((at, tok)) => {
                toks.push(tok);
                let ok = after.num("permit_ok");
                if ok >= at {
                    wrong.push(format!(
                        "round {k}: holder's permit is_lost started {:.1} ms after the rival \
                         was given the permit (token {tok}) and said held",
                        ms(ok - at)
                    ));
                }
                for (kk, want) in [("pcurrent", "false"), ("give", "false")] {
                    if after.get(kk) != want {
                        wrong.push(format!("round {k}: stale permit {kk} = {}", after.get(kk)));
                    }
                }
            }
            None => {
                if after.get("pcurrent") != "true" {
                    wrong.push(format!(
                        "round {k}: the rival got no permit but the holder's is_current = {}",
                        after.get("pcurrent")
                    ));
                }
            }
        }
        rival.give_back();
    }
    // The long stops must have handed over (else the round did not test anything).
    assert!(
        gens.len() >= plan.len() + 2 && toks.len() >= plan.len() + 2,
        "the stops longer than the TTL handed nothing over: gens {gens:?} tokens {toks:?}"
    );
    assert!(
        gens.windows(2).all(|w| w[0] < w[1]),
        "lease generations not strictly increasing: {gens:?}"
    );
    assert!(
        toks.windows(2).all(|w| w[0] < w[1]),
        "permit tokens not strictly increasing: {toks:?}"
    );
    assert!(wrong.is_empty(), "the stopped holder: {wrong:#?}");
}

// ---------------------------------------------------------------------------------------
// 2. a claim in flight across the TTL
// ---------------------------------------------------------------------------------------

/// Connects to `endpoints` (the first is the member the parent hangs) with a 20 s
/// request timeout; claims `<key>` once and releases it (the session is granted and
/// kept); reports `warm`; waits for `<dir>/go`, reports `sending`, calls `try_claim`
/// (sent to the hung member) and reports what it returned and whether `is_lost` says
/// the returned claim is lost.
fn role_inflight_claimer() {
    let etcd = connect(
        &endpoints_arg(),
        Duration::from_secs(2),
        KeepAlive::Background,
        Duration::from_secs(20),
    );
    let lease = EtcdLease::new(&etcd, &arg("key"), 0u64).expect("lease");
    let c = lease.try_claim().expect("warm claim").expect("vacant");
    assert!(lease.release(&c).expect("warm release"));
    report("warm");
    child_wait_for_path(&path_arg("dir").join("go"), common::CHILD_PATIENCE);
    report(format!("sending at={}", mono_ns()));
    let r = lease.try_claim();
    let at = mono_ns();
    match r {
        Ok(Some(c)) => report(format!(
            "claimed=true gen={} returned={at} lost={} current={:?}",
            c.generation(),
            lease.is_lost(&c),
            lease.is_current(&c).ok()
        )),
        Ok(None) => report(format!("claimed=false gen=0 returned={at} lost=na")),
        Err(e) => report(format!(
            "claimed=err gen=0 returned={at} lost=na err={}",
            format!("{e}").replace(' ', "_")
        )),
    }
}

/// The holder's `try_claim` goes to a follower that is hung (SIGSTOP), so it is applied
/// only when the follower resumes; the holder process is SIGSTOPped before that, so the
/// reply waits unread in its socket while its session (TTL 2 s) expires and a rival in
/// the parent acquires the lease. Then the holder is continued and its `try_claim`
/// returns. `FencedLease::try_claim` (crates/cxc-sync/src/backend.rs): "Claims the lease
/// if it is free (or its holder failed over), without blocking. `Ok(None)` if someone
/// else holds it."; docs/etcd.md "Two holders" / "At most one current claim", and the
/// pitfall "Do not act on the old claim". Judged: `try_claim` does not return a claim
/// while the rival holds the lease (the rival's claim is still current after).
#[test]
fn a_claim_in_flight_across_the_ttl_is_not_returned_as_held() {
    child_dispatch();
    let _one = serial();
    let mut cluster = EtcdCluster::start(3);
    let leader = cluster.leader();
    let f = (leader + 1) % 3;
    let dir = tempfile::tempdir().expect("tempdir");
    let key = "r35i/lease";
    let t = "a_claim_in_flight_across_the_ttl_is_not_returned_as_held";
    let hep = starting_with(&cluster, f);
    let mut kid = child(t, "inflight_claimer", &hep[0], key)
        .arg("endpoints", hep.join(","))
        .arg("dir", dir.path())
        .spawn();
    assert_eq!(kid.next_report(Duration::from_secs(60)), "warm");
    cluster.hang(f);
    std::fs::write(dir.path().join("go"), "").expect("go");
    let sending = kid.next_report(Duration::from_secs(10));
    assert!(sending.starts_with("sending"), "{sending}");
    std::thread::sleep(Duration::from_millis(200));
    kid.stop();
    kid.wait_state('T', Duration::from_secs(5));
    cluster.resume(f);
    let ttl = Duration::from_secs(2);
    let etcd = connect(
        &others(&cluster, f),
        ttl,
        KeepAlive::Background,
        Duration::from_secs(1),
    );
    // The holder's claim is applied once the follower resumes (its key appears).
    let prefix = format!("{key}/");
    assert!(
        wait_until(Duration::from_secs(10), || keys_under(&etcd, &prefix).len()
            == 1),
        "the in-flight claim was never applied (keys {:?}): the scenario did not happen",
        keys_under(&etcd, &prefix)
    );
    let rival = EtcdLease::new(&etcd, key, 0u64).expect("lease");
    let rc = patiently("rival acquire", Duration::from_secs(20), || {
        rival.acquire(Duration::from_secs(15))
    })
    .expect("the rival never got the lease");
    let r_at = mono_ns();
    kid.cont();
    let got = kid.next_report(Duration::from_secs(30));
    kid.finish(Duration::from_secs(30));
    eprintln!(
        "attack35 in-flight claim: {got} (rival gen {})",
        rc.generation()
    );
    let g = fields(&got);
    assert!(
        rival.is_current(&rc).expect("rival current"),
        "the rival lost its claim"
    );
    let returned: u64 = g["returned"].parse().expect("returned");
    assert!(returned > r_at);
    assert!(
        g["claimed"] != "true",
        "try_claim returned Some(claim gen {}) {:.1} ms after the rival (gen {}) was given \
         the lease, which it still holds (holder's is_lost on it: {}, is_current: {})",
        g["gen"],
        ms(returned - r_at),
        rc.generation(),
        g["lost"],
        g["current"]
    );
}

// ---------------------------------------------------------------------------------------
// 3. a member hung while the holder's renewal is due
// ---------------------------------------------------------------------------------------

/// The holder (a process) prefers member `m`, which is SIGSTOPped just before the
/// holder's renewal is due: a follower for 1.5 s with TTL 2 s, then the leader for
/// 1.2 s with TTL 4 s. docs/etcd.md: "a hung or dead minority member costs a connection
/// one request timeout before its requests go elsewhere, and a keep-alive at most
/// TTL/6; a hung leader also the election of a new one"; the measured table: "one
/// follower SIGSTOPped for 20 s ... 0/8 claims lost"; "a hung and resumed leader (2 s,
/// twice, `T` = 4 s) costs no claim or permit". Judged: the holder's loss checks never
/// said lost, its claim and permit are current after, and the rival polling on the
/// other members was given neither.
#[test]
fn a_member_hung_while_the_renewal_is_due_costs_no_claim() {
    child_dispatch();
    let _one = serial();
    let mut cluster = EtcdCluster::start(3);
    let t = "a_member_hung_while_the_renewal_is_due_costs_no_claim";
    let mut wrong = Vec::new();
    for (k, leader_hang) in [false, true].into_iter().enumerate() {
        let leader = cluster.leader();
        let m = if leader_hang {
            leader
        } else {
            (leader + 1) % 3
        };
        let (ttl, off, hold) = if leader_hang {
            (Duration::from_secs(4), 1250u64, 1200u64)
        } else {
            (Duration::from_secs(2), 600, 1500)
        };
        let key = format!("r35m{k}");
        let etcd = connect(
            &others(&cluster, m),
            ttl,
            KeepAlive::Background,
            Duration::from_secs(1),
        );
        let rival = Rival::new(&etcd, &key);
        let hep = starting_with(&cluster, m);
        let (_ready, after, (gl, gp)) = round(
            t,
            &mut cluster,
            &hep,
            &rival,
            &key,
            ttl,
            Duration::from_millis(off),
            Duration::from_millis(hold),
            Freeze::Member(m),
        );
        eprintln!(
            "attack35 member hang (leader={leader_hang}, member {m}, TTL {ttl:?}, at +{off} ms \
             for {hold} ms): rival claim={gl:?} permit={gp:?}; holder {}",
            after.0
        );
        if gl.is_some() || gp.is_some() {
            wrong.push(format!(
                "round {k}: the rival was given claim={gl:?} permit={gp:?}"
            ));
        }
        for kk in ["lease_lost", "permit_lost"] {
            if after.num(kk) != 0 {
                wrong.push(format!("round {k}: the holder's {kk} check said lost"));
            }
        }
        for kk in ["current", "pcurrent"] {
            if after.get(kk) != "true" {
                wrong.push(format!(
                    "round {k}: holder's {kk} after = {}",
                    after.get(kk)
                ));
            }
        }
        rival.give_back();
        // Let the resumed member catch up before the next round.
        cluster.wait_healthy(&[0, 1, 2]);
    }
    assert!(
        wrong.is_empty(),
        "a member hung at renewal time: {wrong:#?}"
    );
}
