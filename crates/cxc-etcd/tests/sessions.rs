//! Sessions, keep-alive modes, handle lifetimes and errors of the etcd backend, against a
//! real server (single process: the multi-process properties are in `etcd_mp.rs`).

mod common;

use std::time::{Duration, Instant};

use common::EtcdServer;
use cxc_etcd::{
    Etcd, EtcdClaim, EtcdError, EtcdLease, EtcdOptions, EtcdSemaphore, FencedLease, KeepAlive,
    PermitPool,
};

const TTL: Duration = Duration::from_secs(1);

fn connect(server: &EtcdServer, keep_alive: KeepAlive) -> Etcd {
    let opts = EtcdOptions::default().ttl(TTL).keep_alive(keep_alive);
    Etcd::connect(&[server.endpoint()], opts).expect("connect")
}

/// A holder `a` whose session is kept alive as `keep_alive` says, its claim on `name`,
/// and a rival `b` kept alive in the background; each on its own connection.
fn holder_and_rival(
    server: &EtcdServer,
    name: &str,
    keep_alive: KeepAlive,
) -> (EtcdLease<u64>, EtcdClaim, EtcdLease<u64>) {
    let a = EtcdLease::new(&connect(server, keep_alive), name, 0u64).expect("a");
    let b = EtcdLease::new(&connect(server, KeepAlive::Background), name, 0u64).expect("b");
    let claim = a.try_claim().expect("claim").expect("vacant");
    (a, claim, b)
}

#[test]
fn beat_driven_holder_that_stops_beating_is_replaced() {
    let server = EtcdServer::start();
    let (a, ca, b) = holder_and_rival(&server, "s/beat", KeepAlive::OnBeat);
    // The process is alive, but it does not beat: the claim lapses after the TTL.
    let t = Instant::now();
    let cb = b
        .acquire(Duration::from_secs(10))
        .expect("acquire")
        .expect("the silent holder was not replaced");
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "replaced before its TTL"
    );
    assert!(cb.generation() > ca.generation());
    assert!(
        !a.beat(&ca).expect("beat"),
        "a lapsed claim's beat must report the loss"
    );
    assert!(!a.write(&ca, 1).expect("write"));
    assert!(b.release(&cb).expect("release"));
    // The lapsed session is replaced by a new one on the next claim.
    let again = a.try_claim().expect("claim").expect("vacant");
    assert!(again.generation() > cb.generation());
    assert_ne!(
        again.session(),
        ca.session(),
        "a lapsed session must not be reused"
    );
}

#[test]
fn beating_keeps_a_beat_driven_claim() {
    let server = EtcdServer::start();
    let (a, c, b) = holder_and_rival(&server, "s/keep", KeepAlive::OnBeat);
    let until = Instant::now() + TTL * 3;
    while Instant::now() < until {
        assert!(a.beat(&c).expect("beat"), "a beating holder lost its claim");
        assert!(
            b.try_claim().expect("claim").is_none(),
            "L1: claimed while held"
        );
        std::thread::sleep(TTL / 4);
    }
    assert!(a.is_current(&c).expect("is_current"));
}

#[test]
fn background_keep_alive_holds_a_silent_claim() {
    let server = EtcdServer::start();
    let (a, c, b) = holder_and_rival(&server, "s/bg", KeepAlive::Background);
    std::thread::sleep(TTL * 3);
    assert!(
        b.try_claim().expect("claim").is_none(),
        "a live process lost its claim"
    );
    assert!(a.is_current(&c).expect("is_current"));
}

#[test]
fn dropping_a_handle_releases_its_claim_and_permits_at_once() {
    let server = EtcdServer::start();
    let etcd = connect(&server, KeepAlive::Background);
    let a = EtcdLease::new(&etcd, "s/drop", 0u64).expect("a");
    let b = EtcdLease::new(&etcd, "s/drop", 0u64).expect("b");
    a.try_claim().expect("claim").expect("vacant");
    drop(a);
    assert!(
        b.try_claim().expect("claim").is_some(),
        "drop did not release at once"
    );

    let p = EtcdSemaphore::open(&etcd, "s/droppool", 2).expect("pool");
    let q = EtcdSemaphore::open(&etcd, "s/droppool", 2).expect("pool");
    assert!(p.try_take().expect("take") && p.try_take().expect("take"));
    assert_eq!(p.held(), 2);
    assert!(!q.try_take().expect("take"));
    drop(p);
    assert_eq!(
        q.available().expect("available"),
        2,
        "drop did not return permits"
    );
}

#[test]
fn semaphore_size_lives_in_etcd() {
    let server = EtcdServer::start();
    let etcd = connect(&server, KeepAlive::Background);
    let p = EtcdSemaphore::open(&etcd, "s/size", 3).expect("pool");
    assert_eq!(p.max(), 3);
    match EtcdSemaphore::open(&etcd, "s/size", 4) {
        Err(EtcdError::MaxMismatch {
            expected, found, ..
        }) => {
            assert_eq!(expected, 4);
            assert_eq!(found, "3");
        }
        other => panic!("expected MaxMismatch, got {other:?}"),
    }
    assert!(matches!(
        EtcdSemaphore::open(&etcd, "s/zero", 0),
        Err(EtcdError::InvalidOption(_))
    ));
    assert!(matches!(
        EtcdLease::new(&etcd, "", 0u64),
        Err(EtcdError::InvalidOption(_))
    ));
}

#[test]
fn wrong_payload_size_is_a_decode_error() {
    let server = EtcdServer::start();
    let etcd = connect(&server, KeepAlive::Background);
    let wide = EtcdLease::new(&etcd, "s/decode", 0u64).expect("u64 lease");
    let c = wide.try_claim().expect("claim").expect("vacant");
    assert!(wide.write(&c, 7).expect("write"));
    assert!(wide.release(&c).expect("release"));
    let narrow = EtcdLease::new(&etcd, "s/decode", 0u32).expect("u32 lease");
    let c = narrow.try_claim().expect("claim").expect("vacant");
    match narrow.read(&c) {
        Err(EtcdError::Decode {
            expected, found, ..
        }) => assert_eq!((expected, found), (4, 8)),
        other => panic!("expected a Decode error, got {other:?}"),
    }
}

#[test]
fn an_unreachable_server_is_an_error_not_a_hang() {
    // A port nobody listens on (bound, then closed).
    let port = common::etcd::free_port();
    let opts = EtcdOptions::default()
        .request_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(200));
    let etcd = Etcd::connect(&[format!("http://127.0.0.1:{port}")], opts).expect("lazy connect");
    let lease = EtcdLease::new(&etcd, "s/down", 0u64).expect("lease");
    let t = Instant::now();
    let r = lease.try_claim();
    assert!(r.is_err(), "claim against no server: {r:?}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    let r = lease.acquire(Duration::from_secs(30));
    assert!(r.is_err(), "acquire against no server: {r:?}");
    assert!(
        EtcdSemaphore::open(&etcd, "s/down", 1).is_err(),
        "open against no server"
    );
}

#[test]
fn ttls_are_validated() {
    let endpoint = ["http://127.0.0.1:1"];
    for (ttl, ok) in [
        (Duration::ZERO, false),
        (Duration::MAX, false),
        (Duration::from_secs(9_000_000_001), false),
        (Duration::from_secs(9_000_000_000), true),
        (Duration::from_millis(1500), true),
        (Duration::from_nanos(1), true),
    ] {
        let r = Etcd::connect(&endpoint, EtcdOptions::default().ttl(ttl));
        match (r, ok) {
            (Ok(_), true) | (Err(EtcdError::InvalidOption(_)), false) => {}
            (r, _) => panic!("TTL {ttl:?}: expected ok={ok}, got {r:?}"),
        }
    }
}

#[test]
fn a_hung_server_is_a_timeout() {
    // Accepts connections and never answers, like a SIGSTOPped member.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let timeout = Duration::from_millis(400);
    let opts = EtcdOptions::default()
        .request_timeout(timeout)
        .connect_timeout(Duration::from_millis(200));
    let etcd = Etcd::connect(&[format!("http://127.0.0.1:{port}")], opts).expect("lazy connect");
    let lease = EtcdLease::new(&etcd, "s/hung", 0u64).expect("lease");
    let pool = EtcdSemaphore::open(&etcd, "s/hung", 1);
    for (what, r) in [
        ("claim", lease.try_claim().map(|_| ())),
        ("holder", lease.holder().map(|_| ())),
        ("open", pool.map(|_| ())),
    ] {
        match r {
            Err(EtcdError::Timeout { timeout: t, .. }) => assert_eq!(t, timeout),
            other => panic!("{what} against a hung server: expected Timeout, got {other:?}"),
        }
    }
    drop(listener);
}

#[test]
fn a_timed_out_write_leaves_the_version_unknown_until_a_read() {
    let server = EtcdServer::start();
    let (a, claim, b) = holder_and_rival(&server, "s/version", KeepAlive::Background);
    assert!(a.write(&claim, 1).expect("write"));
    // Another handle using the same claim must read before it writes.
    assert!(matches!(
        b.write(&claim, 2),
        Err(EtcdError::Conflict { .. })
    ));
    assert_eq!(b.read(&claim).expect("read"), Some(1));
    assert!(b.write(&claim, 2).expect("write"));
    // `a` still knows the version it wrote: the value moved since, so its write is
    // refused (nothing written) and it must read again.
    assert!(matches!(
        a.write(&claim, 3),
        Err(EtcdError::Conflict { .. })
    ));
    assert!(matches!(
        a.write(&claim, 3),
        Err(EtcdError::Conflict { .. })
    ));
    assert_eq!(a.read(&claim).expect("read"), Some(2));
    assert!(a.write(&claim, 3).expect("write"));
    // Claiming again what the handle holds does not make a moved version known again:
    // only a read does.
    assert_eq!(b.read(&claim).expect("read"), Some(3));
    assert!(b.write(&claim, 4).expect("write"));
    assert!(matches!(
        a.write(&claim, 5),
        Err(EtcdError::Conflict { .. })
    ));
    assert_eq!(
        a.try_claim().expect("claim"),
        Some(claim),
        "idempotent re-claim"
    );
    assert!(matches!(
        a.write(&claim, 5),
        Err(EtcdError::Conflict { .. })
    ));
    assert_eq!(a.read(&claim).expect("read"), Some(4));
    assert!(a.write(&claim, 5).expect("write"));
    // A stale claim is still a plain refusal, known version or not.
    assert!(a.release(&claim).expect("release"));
    assert!(!a.write(&claim, 6).expect("stale write"));
    assert!(!b.write(&claim, 6).expect("stale write"));
}

#[test]
fn the_loss_notification_fires_at_the_local_deadline_and_not_before() {
    let server = EtcdServer::start();
    // Kept alive in the background: not lost while we wait (TTL 2 s: margin for a
    // loaded machine).
    let opts = EtcdOptions::default().ttl(Duration::from_secs(2));
    let kept_etcd = Etcd::connect(&[server.endpoint()], opts).expect("connect");
    let kept = EtcdLease::new(&kept_etcd, "s/kept", 0u64).expect("lease");
    let kc = kept.try_claim().expect("claim").expect("vacant");
    let t = Instant::now();
    assert!(
        !kept.wait_lost(&kc, TTL * 2),
        "a kept-alive claim reported lost"
    );
    assert!(t.elapsed() >= TTL * 2);
    assert!(!kept.is_lost(&kc));
    assert!(kept.is_current(&kc).expect("is_current"));
    // Beat-driven and never beaten: lost at its local deadline (grant + TTL), which is
    // no later than etcd's expiry.
    let idle = EtcdLease::new(&connect(&server, KeepAlive::OnBeat), "s/idle", 0u64).expect("lease");
    let t = Instant::now();
    let ic = idle.try_claim().expect("claim").expect("vacant");
    assert!(idle.wait_lost(&ic, TTL * 5), "never reported lost");
    let after = t.elapsed();
    assert!(
        after <= TTL + Duration::from_secs(1),
        "reported lost after {after:?}"
    );
    assert!(idle.is_lost(&ic));
    assert!(!idle.is_current(&ic).expect("is_current"));
    assert!(
        !idle.beat(&ic).expect("beat"),
        "a presumed-lost claim cannot be beaten back"
    );
}

#[test]
fn permit_guards_give_back_on_drop_and_report_on_release() {
    let server = EtcdServer::start();
    let pool =
        EtcdSemaphore::open(&connect(&server, KeepAlive::Background), "s/guards", 2).expect("pool");
    let a = pool.try_acquire().expect("take").expect("free");
    let b = pool
        .acquire_timeout(Duration::from_secs(1))
        .expect("take")
        .expect("free");
    assert!(b.token() > a.token(), "tokens grow");
    assert!(
        pool.try_acquire().expect("take").is_none(),
        "pool of 2 is full"
    );
    assert!(a.is_current().expect("is_current") && !a.is_lost());
    assert_eq!(pool.held(), 2);
    drop(a);
    assert_eq!(pool.available().expect("available"), 1, "drop gave it back");
    assert_eq!(pool.held(), 1);
    assert!(b.release().expect("release"), "a held permit is given back");
    assert_eq!(pool.available().expect("available"), 2);
    // A guard turned into a plain permit stays held until given.
    let c = pool
        .try_acquire()
        .expect("take")
        .expect("free")
        .into_permit();
    assert_eq!(pool.available().expect("available"), 1);
    assert!(pool.give_permit(&c).expect("give"));
    assert!(!pool.give_permit(&c).expect("give"), "given twice");
    assert_eq!(pool.available().expect("available"), 2);
}
