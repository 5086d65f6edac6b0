"""unisonrun's multi-host options become the right mpiexec arguments (no MPI job started)."""

from __future__ import annotations

from unison.launcher.cli import parser
from unison.launcher.mpi.mpiexec import MpiExec


def test_launcher_exec_and_iface_for_mpich() -> None:
    cmd = MpiExec("mpiexec", "mpich", "5.0").command(4, ["python", "t.py"], hosts="h0:2,h1:2",
                                                      launcher_exec="/tmp/x", iface="eth0")
    assert cmd[:5] == ["mpiexec", "-n", "4", "-hosts", "h0:2,h1:2"]
    joined = " ".join(cmd)
    assert "-launcher ssh -launcher-exec /tmp/x" in joined
    assert "-iface eth0" in joined
    for pair in ("MPIR_CVAR_CH4_NETMOD ofi", "FI_PROVIDER tcp", "FI_TCP_IFACE eth0"):
        assert f"-genv {pair}" in joined
    assert cmd[-2:] == ["python", "t.py"]


def test_launcher_exec_and_iface_for_openmpi() -> None:
    cmd = MpiExec("mpirun", "openmpi", "4.1").command(2, ["p"], launcher_exec="/tmp/x", iface="eth1")
    joined = " ".join(cmd)
    assert "--mca plm_rsh_agent /tmp/x" in joined
    assert "--mca btl_tcp_if_include eth1" in joined and "-genv" not in joined


def test_without_the_options_nothing_is_added() -> None:
    cmd = MpiExec("mpiexec", "mpich", "5.0").command(2, ["p"])
    assert cmd == ["mpiexec", "-n", "2", "p"]


def test_iface_defaults_to_unison_iface(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("UNISON_IFACE", "veth7")
    assert parser().parse_args(["-np", "2", "p"]).iface == "veth7"
    monkeypatch.delenv("UNISON_IFACE")
    assert parser().parse_args(["-np", "2", "--iface", "eth0", "p"]).iface == "eth0"
