"""lab/investigations/nanogpt_numerics.py: nanoGPT's model.py is read at run time (a path, or a git
mirror's HEAD), and without one the script says so and exits 0."""

import subprocess
import sys
from argparse import Namespace

from helpers.lab_scripts import lab_script_path, load_lab_script


def test_without_nanogpt_the_script_says_so_and_exits_0(tmp_path, monkeypatch, capsys):
    script = load_lab_script("nanogpt_numerics")
    monkeypatch.syspath_prepend(str(lab_script_path("nanogpt_numerics").parent))
    monkeypatch.setattr(sys, "argv", ["nanogpt_numerics.py", "--nanogpt-git-dir", str(tmp_path / "absent")])
    assert script.main() == 0
    out = capsys.readouterr().out
    assert out.startswith("skipped: no nanoGPT model.py") and str(tmp_path / "absent") in out
    monkeypatch.setattr(sys, "argv", ["nanogpt_numerics.py", "--model-py", str(tmp_path / "model.py")])
    assert script.main() == 0 and "skipped" in capsys.readouterr().out


def test_model_py_is_read_from_a_path_or_out_of_a_git_mirror(tmp_path):
    script = load_lab_script("nanogpt_numerics")
    repo = tmp_path / "nanoGPT"
    repo.mkdir()
    (repo / "model.py").write_text("class GPT: pass\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "model.py"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "model"], check=True)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    args = Namespace(model_py=None, nanogpt_git_dir=str(repo / ".git"))
    assert open(script.model_py(args, scratch)).read() == "class GPT: pass\n"
    assert script.model_py(Namespace(model_py=str(repo / "model.py"), nanogpt_git_dir=None), scratch) == str(
        repo / "model.py")
