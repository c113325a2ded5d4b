"""Issue 55 points 4 and 5: the row reports and sealed recipes between formtax's vLLM backend and its plugin.

A report is kept only when it verifies under the secret, for a row the inbox waits for, and a streamed row's
steps only from one sender, in order; late reports are dropped. A recipe is bound to its row key and report
address and accepted once; the secret is in the environment only while formtax starts its engine; a non-ASCII tag
is refused, never a TypeError. The socket: ``ipc://`` in a 0700 directory, or a configured TCP address."""

from __future__ import annotations

import json
import os
import stat
import time

import pytest

from formtax.backends.vllm import row_reports as rr
from formtax.decoding.plan import RowOutput, Step


def out(tokens):
    return RowOutput(prompt_ids=[1], tokens=tokens, steps=[Step(t, "answer", False, True) for t in tokens],
                     finish_reason="eos")


def test_a_forged_or_unknown_report_changes_nothing_and_is_not_kept():
    inbox = rr.MemoryInbox()
    try:
        inbox.expect("k")
        forged = json.dumps({"key": "k", "error": None, "tokens": [9], "steps": [[9, "answer", 1, 1]],
                             "finish_reason": "eos", "masked_mass": 0.5, "events": []}).encode()
        inbox.deliver(b"0" * 64 + b":" + forged)  # a tag that does not verify
        inbox.deliver(forged)  # no tag
        inbox.deliver(rr.encode("other", out([5]), None))  # verifies, but no one waits for it
        assert inbox._got == {} and inbox.dropped == 3
        inbox.deliver(rr.encode("k", out([7, 8]), None))
        got = inbox.collect(["k"], timeout=0.1)
        assert got["k"]["tokens"] == [7, 8]
        inbox.deliver(rr.encode("k", out([1]), None))  # late: after collect
        assert inbox._got == {} and inbox.dropped == 4
    finally:
        inbox.close()


def test_streamed_steps_come_in_order_from_one_sender():
    inbox = rr.MemoryInbox()
    seen = []
    try:
        inbox.listen("k", lambda t, p: seen.append(t))
        inbox.deliver(rr.encode_step("k", 5, "answer", 0))
        inbox.deliver(rr.encode_step("k", 5, "answer", 0))  # a second worker's copy: same index
        inbox.deliver(rr.encode_step("k", 9, "answer", 2))  # out of order
        inbox.deliver(rr.encode_step("k", 6, "answer", 1))
        assert seen == [5, 6]
    finally:
        inbox.close()


def test_a_recipe_is_bound_to_its_row_and_address_and_accepted_once():
    sealed = rr.seal(print, "row-1", "ipc:///tmp/x")
    assert rr.unseal(sealed, "row-1", "ipc:///tmp/x") is print
    for key, address in [("row-2", "ipc:///tmp/x"), ("row-1", "tcp://10.1.2.3:5555")]:
        with pytest.raises(ValueError, match="does not verify"):
            rr.unseal(sealed, key, address)
    rr.unseal(sealed, "row-1", "ipc:///tmp/x", once=True)
    with pytest.raises(ValueError, match="replay"):
        rr.unseal(sealed, "row-1", "ipc:///tmp/x", once=True)


@pytest.mark.parametrize("tag", ["é" * 64, "\ud800" * 64, "Z" * 64, ""])
def test_a_strange_tag_is_refused_not_a_type_error(tag):
    sealed = rr.seal(print, "k", "a")
    _, nonce, blob = sealed.split(":")
    with pytest.raises(ValueError, match="does not verify"):
        rr.unseal(f"{tag}:{nonce}:{blob}", "k", "a")
    inbox = rr.MemoryInbox()
    inbox.expect("k")
    inbox.deliver(tag.encode("utf-8", "surrogatepass") + b":" + b'{"key": "k"}')
    assert inbox.dropped == 1
    inbox.close()


def test_the_secret_is_in_the_environment_only_while_the_engine_starts():
    os.environ.pop(rr.SECRET_ENV, None)
    secret = rr.ensure_secret()
    assert rr.SECRET_ENV not in os.environ
    with rr.engine_environment():
        assert os.environ[rr.SECRET_ENV] == secret.decode()
        assert rr.SECRET_ENV in os.environ[rr.RAY_COPY_ENV].split(",")
    assert rr.SECRET_ENV not in os.environ


def test_the_stock_server_started_beside_formtax_never_gets_the_secret(monkeypatch):
    import inspect

    from tests.vllm import stock_server

    src = inspect.getsource(stock_server.serve)
    assert "child_env.pop(SECRET_ENV" in src  # and nothing else puts it back afterwards
    assert "env=child_env" in src


def _wait(pred, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end and not pred():
        time.sleep(0.02)
    return pred()


def test_the_socket_is_ipc_in_a_private_directory():
    pytest.importorskip("zmq")
    inbox = rr.ZmqInbox()
    try:
        assert inbox.address.startswith("ipc://")
        folder = os.path.dirname(inbox.address.removeprefix("ipc://"))
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        inbox.expect("k")
        rr.send(inbox.address, rr.encode("unknown", out([3]), None))
        rr.send(inbox.address, rr.encode("k", out([4]), None))
        assert inbox.collect(["k"], timeout=5.0)["k"]["tokens"] == [4]
        assert _wait(lambda: inbox.dropped == 1)
    finally:
        inbox.close()
    assert not os.path.exists(folder)


def test_a_configured_tcp_address_reports_too(monkeypatch):
    pytest.importorskip("zmq")
    monkeypatch.setenv(rr.REPORT_BIND_ENV, "tcp://127.0.0.1:0")
    monkeypatch.setenv(rr.REPORT_ADDRESS_ENV, "tcp://127.0.0.1")
    inbox = rr.ZmqInbox()
    try:
        assert inbox.address.startswith("tcp://127.0.0.1:") and not inbox.address.endswith(":0")
        inbox.expect("k")
        rr.send(inbox.address, rr.encode("k", out([4, 5]), None))
        assert inbox.collect(["k"], timeout=5.0)["k"]["tokens"] == [4, 5]
        import zmq

        rogue = zmq.Context.instance().socket(zmq.PUSH)  # another sender without the secret
        rogue.connect(inbox.address)
        inbox.expect("j")
        rogue.send(json.dumps({"key": "j", "tokens": [1]}).encode())
        rogue.send(b"x" * 64 + b":" + json.dumps({"key": "j"}).encode())
        assert _wait(lambda: inbox.dropped >= 2)
        assert inbox.collect(["j"], timeout=0.0) == {}
        rogue.close(linger=0)
    finally:
        inbox.close()
