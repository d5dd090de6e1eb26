"""Log capture and parsing (launch/logs.py): Trainer dicts, tqdm, '\\r' handling, markers, bounds."""

import io

from launch.logs import MAX_LINE_BYTES, StreamCapture, exception_line, parse_tqdm, parse_trainer_log
from launch.rundir import RotatingLog


def test_trainer_log_dict_transformers5_quoted_numbers():
    d = parse_trainer_log("   {'loss': '4.865', 'grad_norm': '2.022', 'learning_rate': '0.001', 'epoch': '0.0004'}")
    assert d == {"loss": 4.865, "grad_norm": 2.022, "learning_rate": 0.001, "epoch": 0.0004}


def test_trainer_log_dict_transformers4_floats_and_noise():
    d = parse_trainer_log("{'loss': 1.23, 'grad_norm': 0.5, 'learning_rate': 5e-05, 'epoch': 0.1, 'note': 'x'}")
    assert d == {"loss": 1.23, "grad_norm": 0.5, "learning_rate": 5e-05, "epoch": 0.1}
    assert parse_trainer_log("{'model': 'llama'}") is None
    assert parse_trainer_log("no dict here") is None
    assert parse_trainer_log("{'loss': broken") is None


def test_tqdm_rates_and_eta():
    p = parse_tqdm(" 12%|█▏        | 12/100 [00:03<00:20,  4.20it/s]")
    assert p == {"step": 12, "total": 100, "elapsed_s": 3.0, "eta_s": 20.0, "rate": 4.2}
    slow = parse_tqdm(" 50%|█████     | 5/10 [01:02:03<00:10,  2.00s/it]")
    assert slow["rate"] == 0.5 and slow["elapsed_s"] == 3723.0
    first = parse_tqdm("  0%|          | 0/6 [00:00<?, ?it/s]")
    assert first["step"] == 0 and first["rate"] is None and first["eta_s"] is None
    assert parse_tqdm("plain text 3/4") is None


def test_carriage_returns_progress_is_parsed_and_throttled(tmp_path):
    log = RotatingLog(tmp_path / "rank-0.log")
    progress, logs = [], []
    t = [100.0]
    cap = StreamCapture(0, log, on_train_log=lambda r, d: logs.append((r, d)),
                        on_progress=lambda r, p: progress.append(p["step"]), clock=lambda: t[0])
    # tqdm draws '\r' + bar; the Trainer prints its dict after a cleared line
    cap.feed(b"\r  0%|          | 0/3 [00:00<?, ?it/s]")
    cap.feed(b"\r 33%|###       | 1/3 [00:00<00:01,  2.00it/s]")
    cap.feed(b"\r                      \r{'loss': '4.5', 'learning_rate': '0.001'}\n")
    t[0] += 10
    cap.feed(b"\r100%|##########| 3/3 [00:01<00:00,  2.00it/s]\n")
    cap.close()
    assert progress[-1] == 3 and 1 in progress
    assert logs == [(0, {"loss": 4.5, "learning_rate": 0.001})]
    text = (tmp_path / "rank-0.log").read_text()
    assert "{'loss': '4.5'" in text
    assert "3/3" in text                 # the final bar is kept
    assert text.count("0/3") <= 1         # redraws are throttled, not all logged


def test_headless_echo_is_rank_prefixed_and_crlf_normalised(tmp_path):
    out = io.BytesIO()
    cap = StreamCapture(3, RotatingLog(tmp_path / "r.log"), echo=out)
    cap.feed(b"hello\r")                  # '\r' at the end of a chunk: maybe half of '\r\n'
    cap.feed(b"\nworld\npartial")
    assert out.getvalue() == b"[rank3] hello\n[rank3] world\n"
    cap.close()
    assert out.getvalue().endswith(b"[rank3] partial\n")
    assert cap.lines == 3


def test_markers_traceback_with_torch_rank_prefix_and_cuda_oom(tmp_path):
    cap = StreamCapture(1, RotatingLog(tmp_path / "r.log"), clock=lambda: 5.0)
    cap.feed(b"[rank1]: Traceback (most recent call last):\n[rank1]:   File \"x.py\", line 1\n"
             b"[rank1]: RuntimeError: deliberate failure on rank 1\n")
    assert cap.markers.traceback_at == 5.0
    assert cap.markers.last_exception == "RuntimeError: deliberate failure on rank 1"
    assert cap.markers.cuda_oom_at is None
    cap.feed(b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    assert cap.markers.cuda_oom_at == 5.0
    cap.feed(b"[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE)\n")
    assert cap.markers.nccl_at == 5.0


def test_a_traceback_glued_to_a_progress_bar_is_still_a_traceback(tmp_path):
    """What a rank printed under the wizard's DeepSpeed CPU config (a real log): tqdm leaves its bar's line
    open, so torch's "[rank1]: Traceback" starts on it, after a redraw that came with its own '\r'."""
    from launch.classify import RankOutcome, _rank_kind
    cap = StreamCapture(1, RotatingLog(tmp_path / "r.log"), clock=lambda: 7.0)
    cap.feed(b"\r  0%|          | 0/50 [00:00<?, ?it/s]\r  4%|\xe2\x96\x8d         | 2/50 [00:00<00:07,  6.37it/s]")
    cap.feed(b"[rank1]: Traceback (most recent call last):\n[rank1]:   File \"x.py\", line 1, in <module>\n"
             b"[rank1]: RuntimeError: deliberate failure on rank 1 at step 2 (--fail-on-rank)\n")
    assert cap.markers.traceback_at == 7.0
    assert cap.markers.last_exception == "RuntimeError: deliberate failure on rank 1 at step 2 (--fail-on-rank)"
    r = RankOutcome(rank=1, exit_code=1, traceback_at=cap.markers.traceback_at,
                    last_exception=cap.markers.last_exception)
    assert _rank_kind(r, stop_requested=False) == "python_exception"


def test_exception_line():
    assert exception_line("ValueError: boom") == "ValueError: boom"
    assert exception_line("torch.OutOfMemoryError: CUDA out of memory.") is not None
    assert exception_line("KeyboardInterrupt") == "KeyboardInterrupt"
    assert exception_line('  File "x.py", line 3') is None
    assert exception_line("loss went down: good") is None


def test_long_line_without_newline_is_bounded(tmp_path):
    cap = StreamCapture(0, RotatingLog(tmp_path / "r.log"))
    chunk = b"x" * 8192
    for _ in range(MAX_LINE_BYTES // len(chunk) + 4):
        cap.feed(chunk)
    assert len(cap.buf) <= MAX_LINE_BYTES + len(chunk)
    assert (tmp_path / "r.log").stat().st_size >= MAX_LINE_BYTES


def test_many_lines_counted_and_logged(tmp_path):
    cap = StreamCapture(0, RotatingLog(tmp_path / "r.log"))
    data = b"".join(b"line %d\n" % i for i in range(10000))
    for i in range(0, len(data), 4000):
        cap.feed(data[i:i + 4000])
    cap.close()
    assert cap.lines == 10000
    assert (tmp_path / "r.log").read_bytes() == data
