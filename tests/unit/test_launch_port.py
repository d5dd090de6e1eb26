"""`wizard launch` on a single machine whose rendezvous port is busy when an attempt starts passes accelerate a
free one itself (issue 27: ACC-PORT-IN-USE promised it, but accelerate warned and fell back on its own);
a multi-machine run keeps its port, which every machine must agree on. The machine's own ports never decide
these results: "busy" is an input here (tests/functional/test_launch_port.py binds a real one)."""

from __future__ import annotations

import socket

from launch.spec import LaunchSpec, build_command, free_port_instead

DDP = {"distributed_type": "MULTI_GPU", "num_machines": 1, "num_processes": 2, "main_process_port": 29511}


def instead(accel, busy=(29511, 29500), **spec):
    return free_port_instead(LaunchSpec(script="t.py", **spec), accel, busy=lambda p: p in busy, pick=lambda: 40000)


def test_a_busy_single_machine_port_is_replaced_by_a_free_one():
    assert instead(DDP) == (29511, 40000)
    assert instead({**DDP, "main_process_port": None}) == (29500, 40000)            # accelerate's default
    assert instead({k: v for k, v in DDP.items() if k != "num_machines"}) == (29511, 40000)
    assert instead(DDP, main_process_port=29500) == (29500, 40000)                 # --main-process-port
    for dtype in ("FSDP", "DEEPSPEED"):
        assert instead({**DDP, "distributed_type": dtype, "num_processes": 1}) == (29511, 40000)


def test_a_free_port_or_none_at_all_is_left_to_accelerate():
    assert instead(DDP, busy=()) is None
    assert instead({**DDP, "main_process_port": 0}) is None                        # accelerate picks one itself
    assert instead({"distributed_type": "NO", "num_processes": 1, "main_process_port": 29511}) is None
    assert instead(None) is None
    assert instead(DDP, accelerate_args=["--main_process_port", "1234"]) is None   # the user's own flag


def test_a_multi_machine_run_keeps_its_port():
    assert instead({**DDP, "num_machines": 2, "num_processes": 4, "main_process_ip": "10.0.0.1"}) is None


def test_the_command_carries_the_port_it_is_given():
    spec = LaunchSpec(script="t.py", main_process_port=29511)
    cmd = build_command(spec, DDP, "/c.yaml", main_process_port=40000)
    assert cmd[cmd.index("--main_process_port") + 1] == "40000" and cmd.count("--main_process_port") == 1


def test_the_default_busy_test_and_free_port_are_this_machines():
    from wizard.probe.ports import free_port, port_in_use

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        found = free_port_instead(LaunchSpec(script="t.py"), {**DDP, "main_process_port": port})
        assert found is not None and found[0] == port and found[1] != port and not port_in_use(found[1])
    assert free_port() > 0
