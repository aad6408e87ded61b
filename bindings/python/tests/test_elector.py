"""cxc.Elector: the API in one process, and the leader's failover between Python
processes (SIGKILL: at once, by the holder's death; SIGSTOP: after the lease duration)."""

import queue
import signal
import threading
import time

import pytest

import cxc
from conftest import (
    assert_exit_raises_lost_only_without_exception,
    interrupt_waiting_child,
    python_child,
    ticks_while,
)


def test_campaign_renew_step_down(tmp_path):
    path = tmp_path / "e.lease"
    el = cxc.Elector(path, grace=1.0, identity="alpha")
    assert (el.identity, el.grace, el.leader()) == ("alpha", 1.0, None)
    with el.campaign(timeout=5) as lead:
        assert isinstance(lead.token, int) and lead.token >= 1
        assert lead.is_current()
        lead.renew()
        assert el.leader() == ("alpha", lead.token)
        first = lead.token
    assert lead.stepped_down and not lead.is_current()
    with pytest.raises(cxc.LostError):
        lead.renew()
    lead.step_down()  # idempotent
    assert el.leader() is None
    lead2 = el.try_campaign()
    assert lead2 is not None and lead2.token > first
    lead2.step_down()
    with pytest.raises(cxc.LostError):
        lead2.renew()


def test_term_lost_without_renewal(tmp_path):
    el = cxc.Elector(tmp_path / "e.lease", grace=0.2)
    lead = el.campaign(timeout=5)
    time.sleep(0.35)  # no renew within the lease duration
    assert not lead.is_current()
    with pytest.raises(cxc.LostError):
        lead.renew()
    assert lead.wait_lost(timeout=0) is True
    with pytest.raises(cxc.LostError):
        lead.step_down()
    # The expired leader resigned: a new term starts at once, with a larger token.
    lead2 = el.try_campaign()
    assert lead2 is not None and lead2.token > lead.token
    lead2.step_down()


def test_exit_raises_lost_only_without_exception(tmp_path):
    el = cxc.Elector(tmp_path / "e.lease", grace=0.2)
    assert_exit_raises_lost_only_without_exception(el.campaign, lambda: time.sleep(0.35))


def test_errors(tmp_path):
    with pytest.raises(cxc.FileError) as e:
        cxc.Elector(tmp_path / "missing", create=False)
    assert e.value.errno == 2 and e.value.filename == str(tmp_path / "missing")
    with pytest.raises(ValueError):
        cxc.Elector(tmp_path / "e.lease", identity="x" * 33)
    with pytest.raises(ValueError):
        cxc.Elector(tmp_path / "e.lease", identity="")
    with pytest.raises(ValueError):
        cxc.Elector(tmp_path / "e2.lease", grace=0)
    # An election file holds a leader record: not a semaphore's, nor a cxc.Lease's
    # 48 raw bytes (the payload types differ), and the other way round.
    cxc.Semaphore(tmp_path / "s", 1)
    with pytest.raises(cxc.FileError):
        cxc.Elector(tmp_path / "s")
    cxc.Lease(tmp_path / "l")
    with pytest.raises(cxc.FileError):
        cxc.Elector(tmp_path / "l")
    cxc.Elector(tmp_path / "e3.lease")
    with pytest.raises(cxc.FileError):
        cxc.Lease(tmp_path / "e3.lease")


# A candidate: campaigns, prints `leader TOKEN T` (T: time.monotonic(), the system-wide
# CLOCK_MONOTONIC, comparable across processes), then renews every 10 ms until the term is
# lost, and prints what it saw: `lost current=... renewed=... step_down=...`.
CANDIDATE = r"""
import sys, time, cxc
el = cxc.Elector(sys.argv[1], grace=float(sys.argv[2]), identity=sys.argv[3])
print("campaigning", flush=True)
lead = el.campaign()
print(f"leader {lead.token} {time.monotonic()}", flush=True)
while True:
    current = lead.is_current()
    try:
        lead.renew()
        renewed = True
    except cxc.LostError:
        renewed = False
    if not (current and renewed):
        break
    time.sleep(0.01)
try:
    lead.step_down()
    stepped = "ok"
except cxc.LostError:
    stepped = "LostError"
print(f"lost current={lead.is_current()} renewed={renewed} step_down={stepped}", flush=True)
"""


class Candidates:
    """Candidate processes whose output lines arrive on one queue as (name, line)."""

    def __init__(self, path, grace):
        self.path, self.grace = path, grace
        self.procs = {}
        self.lines = queue.Queue()

    def start(self, name):
        p = python_child(CANDIDATE, self.path, self.grace, name)
        self.procs[name] = p

        def pump():
            for line in p.stdout:
                self.lines.put((name, line.split()))

        threading.Thread(target=pump, daemon=True).start()
        return p

    def next(self, timeout=10.0):
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            errs = {n: p.poll() for n, p in self.procs.items()}
            raise AssertionError(f"no output within {timeout} s; exit codes {errs}")

    def expect(self, name, word, timeout=10.0):
        got_name, words = self.next(timeout)
        assert (got_name, words[0]) == (name, word), (got_name, words)
        return words

    def quiet(self, secs):
        try:
            got = self.lines.get(timeout=secs)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected output {got}")

    def kill_all(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
            p.wait()


def test_failover_after_sigkill(tmp_path):
    path = tmp_path / "e.lease"
    grace = 5.0  # a takeover within 2 s is the holder's death, not the lease duration
    observer = cxc.Elector(path, grace=grace, identity="observer")
    c = Candidates(path, grace)
    try:
        c.start("a")
        c.expect("a", "campaigning")
        token = int(c.expect("a", "leader")[1])
        for n in ("b", "c"):
            c.start(n)
            c.expect(n, "campaigning")
        c.quiet(0.3)  # the standbys block in campaign()
        assert observer.leader() == ("a", token)
        alive = {"b", "c"}
        for victim in ("a", None):
            victim = victim or leader
            t0 = time.monotonic()
            c.procs[victim].kill()
            leader, words = c.next()
            assert words[0] == "leader" and leader in alive, (leader, words)
            new_token, won_at = int(words[1]), float(words[2])
            assert new_token > token, "a later leader has a strictly larger token"
            assert won_at - t0 < 2.0, f"took over after {won_at - t0:.3f} s"
            print(f"\n{victim} killed: {leader} leads after {(won_at - t0) * 1e3:.1f} ms")
            token = new_token
            alive.discard(leader)
            assert observer.leader() == (leader, token)
        c.quiet(0.3)  # exactly one standby won each time
    finally:
        c.kill_all()


def test_failover_after_sigstop(tmp_path):
    path = tmp_path / "e.lease"
    grace = 0.5
    c = Candidates(path, grace)
    try:
        c.start("a")
        c.expect("a", "campaigning")
        token = int(c.expect("a", "leader")[1])
        c.start("b")
        c.expect("b", "campaigning")
        c.quiet(0.3)
        t0 = time.monotonic()
        c.procs["a"].send_signal(signal.SIGSTOP)
        words = c.expect("b", "leader", timeout=grace + 5)
        new_token, won_at = int(words[1]), float(words[2])
        assert new_token > token
        # The term runs from the last renewal (at most ~10 ms before the stop).
        assert 0.6 * grace <= won_at - t0 < grace + 2.0, f"after {won_at - t0:.3f} s"
        print(f"\na stopped: b leads after {(won_at - t0) * 1e3:.0f} ms (grace {grace} s)")
        c.procs["a"].send_signal(signal.SIGCONT)
        words = c.expect("a", "lost")
        assert words[1:] == ["current=False", "renewed=False", "step_down=LostError"]
        assert c.procs["a"].wait(timeout=5) == 0
        c.quiet(0.2)  # b still leads
        assert cxc.Elector(path, grace=grace).leader() == ("b", new_token)
    finally:
        c.kill_all()


STANDBY = r"""
import sys, cxc
el = cxc.Elector(sys.argv[1], identity="standby")
print("campaigning", flush=True)
try:
    el.campaign()
except KeyboardInterrupt:
    print("interrupted", el.leader()[0], flush=True)
    sys.exit(3)
"""


def test_campaign_releases_gil_and_ctrl_c_interrupts(tmp_path):
    path = tmp_path / "e.lease"
    lead = cxc.Elector(path, grace=5.0, identity="leader").campaign()
    # Another process campaigns while this one leads: SIGINT ends its campaign.
    out, code = interrupt_waiting_child(STANDBY, path, "campaigning")
    assert code == 3 and out.split() == ["interrupted", "leader"]
    # A thread of this process that blocks in wait_lost() does not hold the GIL.
    result = []
    t = threading.Thread(target=lambda: result.append(lead.wait_lost(timeout=0.5)))
    assert ticks_while(t) > 100 and result == [False]
    lead.renew()
    lead.step_down()
    assert lead.wait_lost(timeout=0) is True
    # A thread of this process that blocks in campaign() does not hold the GIL either
    # (another process leads).
    c = Candidates(path, 5.0)
    try:
        c.start("other")
        c.expect("other", "campaigning")
        c.expect("other", "leader")
        el = cxc.Elector(path, grace=5.0)
        errors = []

        def campaign():
            try:
                el.campaign(timeout=0.5)
            except BaseException as e:  # noqa: BLE001 - collected for the assertion
                errors.append(e)

        t = threading.Thread(target=campaign)
        assert ticks_while(t) > 100
        assert len(errors) == 1 and isinstance(errors[0], cxc.Timeout)
    finally:
        c.kill_all()


def test_rust_and_python_candidates_share_the_election(tmp_path, elect_hold):
    import subprocess

    path = tmp_path / "e.lease"
    el = cxc.Elector(path, grace=1.0, identity="python")
    # Rust leads: Python cannot, and sees the Rust leader; Rust steps down, Python leads.
    rust = subprocess.Popen([elect_hold, str(path), "lead", "0.6"], stdout=subprocess.PIPE, text=True)
    words = rust.stdout.readline().split()
    assert words[0] == "leader"
    rust_token = int(words[1])
    assert el.try_campaign() is None
    assert el.leader() == ("rust", rust_token)
    t0 = time.monotonic()
    with el.campaign(timeout=5) as lead:
        assert rust.stdout.readline().strip() == "stepped-down"
        assert time.monotonic() - t0 > 0.3
        assert lead.token > rust_token
        r = subprocess.run([elect_hold, str(path), "try"], capture_output=True, text=True)
        assert r.stdout.strip() == "busy"
        python_token = lead.token
    rust.wait(timeout=5)
    r = subprocess.run([elect_hold, str(path), "try"], capture_output=True, text=True)
    assert r.stdout.split()[0] == "leader" and int(r.stdout.split()[1]) > python_token
    # A SIGKILLed Rust leader is replaced by the Python standby at once.
    rust = subprocess.Popen([elect_hold, str(path), "lead", "60"], stdout=subprocess.PIPE, text=True)
    assert rust.stdout.readline().split()[0] == "leader"
    t0 = time.monotonic()
    rust.kill()
    with el.campaign(timeout=5):
        assert time.monotonic() - t0 < 0.9, "taken over before the 1 s lease duration"
    rust.wait()
