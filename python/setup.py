"""Builds gmlake._C against the installed torch (torch.utils.cpp_extension).

libgmlake-client and gmlake.h are looked for in $GMLAKE_PREFIX (lib/ and
include/), else in this repository's build (../build, ../client/include or
../include), else in /usr/local. The extension links the shared library and
keeps its directory as an rpath.
    pip install --no-build-isolation ./python
    python3 setup.py build_ext --inplace      (from python/)
Where torch cannot be imported, the package is installed without the
extension (stats(), the growable ranges and pause/resume work through
ctypes; enable() says it needs PyTorch), and this says so on stderr
(pip shows it with -v).
"""
import os
import sys

from setuptools import setup

try:
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension
    torch_missing = None
except ImportError as e:
    torch_missing = str(e)

here = os.path.dirname(os.path.abspath(__file__))
repo = os.path.dirname(here)


def find():
    prefix = os.environ.get("GMLAKE_PREFIX")
    cands = []
    if prefix:
        cands.append((os.path.join(prefix, "lib"), [os.path.join(prefix, "include")]))
    build = os.environ.get("BUILD", "build")
    cands.append((os.path.join(repo, build), [os.path.join(repo, "include"), os.path.join(repo, "client", "include")]))
    cands.append(("/usr/local/lib", ["/usr/local/include"]))
    for lib, incs in cands:
        if os.path.exists(os.path.join(lib, "libgmlake-client.so")):
            for inc in incs:
                if os.path.exists(os.path.join(inc, "gmlake.h")):
                    return os.path.abspath(lib), os.path.abspath(inc)
    raise SystemExit("gmlake: libgmlake-client.so and gmlake.h not found: run `make` in the repository, "
                     "`make install`, or set GMLAKE_PREFIX")


if torch_missing:
    sys.stderr.write(
        "gmlake: the PyTorch extension gmlake._C is not built: import torch failed (%s). Installing the "
        "pure-Python package: gmlake.stats(), the growable ranges and pause/resume work through ctypes; "
        "gmlake.enable() needs PyTorch: install torch, then pip install --no-build-isolation ./python again\n"
        % torch_missing)
    setup(packages=["gmlake"])
else:
    lib, inc = find()
    setup(
        packages=["gmlake"],
        ext_modules=[CUDAExtension(
            "gmlake._C", ["gmlake/_C.cpp"],
            include_dirs=[inc],
            library_dirs=[lib],
            libraries=["gmlake-client"],
            extra_link_args=["-Wl,-rpath," + lib],
            extra_compile_args={"cxx": ["-O2"] + os.environ.get("GMLAKE_EXT_DEFINES", "").split()},
        )],
        cmdclass={"build_ext": BuildExtension},
    )
