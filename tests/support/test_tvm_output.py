"""TVM's scope warnings are filtered at file descriptor 2; everything else still arrives, in order."""

import os
import subprocess
import sys
import textwrap

import pytest

from korch_tvm.support.tvm_output import LineFilter

NOISE_SAVING = b"[19:12:25] /project/src/runtime/vm/executable.cc:276: Warning: Scope Saving:\n"
NOISE_LOADED = b"[19:12:25] /project/src/runtime/vm/executable.cc:340: Warning: Scope Loaded:global\n"


def test_line_filter_drops_scope_lines_and_keeps_the_rest_in_order():
    lines = LineFilter()
    data = (b"first\n" + NOISE_SAVING + b"[19:12:25] other.cc:1: Warning: something else\n"
            + NOISE_LOADED + b"last\n")
    assert lines.feed(data) == (b"first\n[19:12:25] other.cc:1: Warning: something else\n"
                                b"last\n")


def test_line_filter_joins_a_noise_line_split_across_reads():
    lines = LineFilter()
    assert lines.feed(b"a\n" + NOISE_SAVING[:20]) == b"a\n"
    assert lines.feed(NOISE_SAVING[20:] + b"b\n") == b"b\n"


def test_line_filter_passes_progress_fragments_at_once():
    lines = LineFilter()
    assert lines.feed(b"\r[korch] costing 3/10") == b"\r[korch] costing 3/10"
    assert lines.feed(b"\r[korch] costing 4/10") == b"\r[korch] costing 4/10"
    # a held fragment that starts like TVM's timestamp goes out when nothing follows it, and the
    # rest of its line then passes even though the whole line would look like noise
    assert lines.feed(b"\n" + NOISE_SAVING[:30]) == b"\n"
    assert lines.release_partial() == NOISE_SAVING[:30]
    assert lines.feed(NOISE_SAVING[30:]) == NOISE_SAVING[30:]


_CHILD = textwrap.dedent("""
    import os, subprocess, sys
    from korch_tvm.support.tvm_output import run_without_tvm_noise

    NOISE = {noise!r}

    def command(args):
        os.write(2, b"one\\n" + NOISE + b"two\\n")
        print("three", file=sys.stderr)
        os.write(2, NOISE * 20)
        subprocess.run([sys.executable, "-c",
                        "import os; os.write(2, " + repr(NOISE) + " + b'four from a child\\\\n')"],
                       check=True)
        os.write(2, b"five, no newline")
        print("tty" if sys.stderr.isatty() else "pipe", flush=True)
        if args == "raise":
            raise RuntimeError("six, the error")
        return 7

    code = run_without_tvm_noise(command, sys.argv[1])
    os.write(2, b"\\nafter\\n")
    sys.exit(code)
""").format(noise=NOISE_SAVING + NOISE_LOADED)


def _run_child(tmp_path, mode):
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    return subprocess.run([sys.executable, str(script), mode], capture_output=True, timeout=120)


def test_filter_keeps_every_other_line_in_order_and_drops_the_noise(tmp_path):
    child = _run_child(tmp_path, "plain")
    assert child.returncode == 7, child.stderr
    assert child.stderr == b"one\ntwo\nthree\nfour from a child\nfive, no newline\nafter\n"
    assert child.stdout == b"pipe\n"


def test_output_before_an_error_arrives_before_the_traceback(tmp_path):
    child = _run_child(tmp_path, "raise")
    assert child.returncode == 1
    text = child.stderr.decode()
    assert "Scope" not in text
    assert text.startswith("one\ntwo\nthree\nfour from a child\nfive, no newline")
    assert text.rstrip().endswith("RuntimeError: six, the error")


def test_a_terminal_stays_a_terminal(tmp_path):
    """Behind the filter stderr is still a tty (the progress line checks), without newline
    translation."""
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    master, slave = os.openpty()
    import tty

    tty.setraw(slave)
    child = subprocess.Popen([sys.executable, str(script), "plain"], stdout=subprocess.PIPE,
                             stderr=slave)
    os.close(slave)
    received = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child and its children closed the terminal
            break
        if not chunk:
            break
        received += chunk
    os.close(master)
    assert child.wait(timeout=120) == 7
    assert child.stdout.read() == b"tty\n"
    assert received == b"one\ntwo\nthree\nfour from a child\nfive, no newline\nafter\n"


def test_real_tvm_export_and_load_print_no_scope_lines(tmp_path, tiny_onnx_path):
    """A VM made from an executable fills its memory-scope table, so the export after it and the
    load of that library each log one scope warning per constant (4 here)."""
    script = tmp_path / "export.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        import onnx, tvm
        from tvm import relax
        from tvm.relax.frontend.onnx import from_onnx
        from korch_tvm.support.tvm_output import run_without_tvm_noise

        def export(path):
            executable = tvm.compile(from_onnx(onnx.load({str(tiny_onnx_path)!r})), target="llvm")
            relax.VirtualMachine(executable, tvm.cpu())
            executable.export_library(path)
            relax.VirtualMachine(tvm.runtime.load_module(path), tvm.cpu())
            print("exported", file=sys.stderr)
            return 0

        quiet = sys.argv[1] == "filtered"
        sys.exit(run_without_tvm_noise(export, sys.argv[2], enabled=quiet))
    """))
    runs = {mode: subprocess.run([sys.executable, str(script), mode, str(tmp_path / f"{mode}.so")],
                                 capture_output=True, timeout=300, text=True)
            for mode in ("unfiltered", "filtered")}
    assert runs["unfiltered"].returncode == 0, runs["unfiltered"].stderr
    assert runs["unfiltered"].stderr.count("Warning: Scope Saving:") == 4
    assert runs["unfiltered"].stderr.count("Warning: Scope Loaded:") == 4
    assert runs["filtered"].returncode == 0, runs["filtered"].stderr
    assert runs["filtered"].stderr == "exported\n"


@pytest.mark.parametrize("verbosity, shown", [([], False), (["-q"], False), (["-v"], True)])
def test_cli_filters_at_default_verbosity_and_with_q_but_not_with_v(tmp_path, verbosity, shown):
    """The CLI's own wiring: a command that writes a scope line to descriptor 2 (as TVM would)
    shows it only with -v; its other output and the error after it show either way."""
    program = textwrap.dedent(f"""
        import os, sys
        import korch_tvm.tools.cli as cli
        original = cli.COMMANDS["run"]
        def noisy(args):
            os.write(2, {NOISE_SAVING!r} + b"kept\\n")
            return original(args)
        cli.COMMANDS["run"] = noisy
        sys.exit(cli.main(sys.argv[1:]))
    """)
    child = subprocess.run([sys.executable, "-c", program, "run", str(tmp_path / "missing.so"),
                            *verbosity], capture_output=True, text=True, timeout=120)
    assert child.returncode == 2
    assert "kept\n" in child.stderr
    assert child.stderr.rstrip().endswith("does not exist")
    assert ("Scope Saving" in child.stderr) == shown
