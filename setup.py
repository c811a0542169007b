"""Everything is declared in pyproject.toml; this file only adds hf_tpu_xla_cpu.pth to the installed files.

Python runs a ``.pth`` file at the top of site-packages at every start-up. hf-tpu's reads ``HF_TPU_XLA_CPU`` and,
when it is set, points TorchTPU at XLA:CPU before anything imports torch (``hf_tpu/xla_cpu/_startup.py``);
otherwise it costs one environment lookup. It goes next to the packages in a wheel, and into the editable wheel
of ``pip install -e`` too.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "hf_tpu_xla_cpu.pth"


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        # A wheel's top level is site-packages; an editable wheel is assembled in the install command's directory.
        target = self.get_finalized_command("install").install_lib if self.editable_mode else self.build_lib
        self.copy_file(str(Path(__file__).with_name(PTH)), str(Path(target) / PTH), preserve_mode=False)


setup(cmdclass={"build_py": BuildPyWithPth})
