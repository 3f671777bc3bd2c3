"""Builds gmlake._C against the installed torch (torch.utils.cpp_extension).

libgmlake-client and gmlake.h are looked for in $GMLAKE_PREFIX (lib/ and
include/), else in this repository's build (../build, ../client/include or
../include), else in /usr/local. The extension links the shared library and
keeps its directory as an rpath.
    pip install ./python          (with or without --no-build-isolation, offline
                                   with --no-index: build_backend/gmlake_build.py)
    python3 setup.py build_ext --inplace      (from python/)
Without build isolation pip builds with the environment's own setuptools
and wheel: a venv made without --system-site-packages has no wheel (this
says what to do instead of setuptools' "invalid command 'bdist_wheel'").
Where this directory is not writable (the copy `make install` ships,
/usr/local/share/gmlake/python, installed by a user), it builds in a
temporary directory instead of build/ here.
GMLAKE_BUILD_EXT=0: the pure-Python package, even where torch is importable.
GMLAKE_EXT_DEFINES: extra compiler flags for the extension (-DNAME=VALUE
...), e.g. to build against a torch whose headers need a define.
Where torch cannot be imported, the package is installed without the
extension (stats(), the growable ranges and pause/resume work through
ctypes; enable() says it needs PyTorch), and this says so on stderr
(pip shows it with -v).
"""
import os
import sysconfig
import sys

from setuptools import setup

if os.environ.get("GMLAKE_BUILD_EXT", "auto") == "0":  # the pure-Python package even where torch is
    torch_missing = "not tried: GMLAKE_BUILD_EXT=0"
else:
    try:
        from torch.utils.cpp_extension import BuildExtension, CUDAExtension
        torch_missing = None
    except ImportError as e:
        torch_missing = "import torch failed (%s)" % e



def wheel_missing():
    """pip's build (dist_info, bdist_wheel) needs the wheel package, unless
    setuptools has its own bdist_wheel (70.1 and later)."""
    if not {"bdist_wheel", "dist_info"} & set(sys.argv[1:]):
        return False
    try:
        import wheel  # noqa: F401
        return False
    except ImportError:
        pass
    try:
        import setuptools.command.bdist_wheel  # noqa: F401
        return False
    except ImportError:
        return True


if wheel_missing():
    raise SystemExit(
        "gmlake: cannot build: the `wheel` package is not installed in this Python (%s), and pip "
        "--no-build-isolation builds with what is installed. Either make the venv with the system's packages "
        "(python3 -m venv --system-site-packages v: Debian's python3-wheel and torch are then seen), or, where a "
        "package index is reachable, `pip install wheel` first; then pip install --no-build-isolation ./python again"
        % sys.executable)

here = os.path.dirname(os.path.abspath(__file__))
repo = os.path.dirname(here)

# setuptools builds in the source tree (build/, gmlake.egg-info): the copy
# `make install` puts in /usr/local/share/gmlake/python is root's, and a user's
# pip install of it failed with "could not create 'build': Permission denied".
# Where the tree is not writable, build in a directory of our own instead.
out_of_tree = {}
if not os.access(here, os.W_OK):
    import atexit
    import shutil
    import tempfile

    tmp = tempfile.mkdtemp(prefix="gmlake-build-")
    atexit.register(shutil.rmtree, tmp, True)
    out_of_tree = {"build": {"build_base": os.path.join(tmp, "build")},
                   "egg_info": {"egg_base": tmp},
                   "bdist_wheel": {"bdist_dir": os.path.join(tmp, "bdist")}}
    sys.stderr.write("gmlake: %s is not writable: building in %s\n" % (here, tmp))


def find():
    prefix = os.environ.get("GMLAKE_PREFIX")
    cands = []
    if prefix:
        cands.append((os.path.join(prefix, "lib"), [os.path.join(prefix, "include")]))
    build = os.environ.get("BUILD", "build")
    cands.append((os.path.join(repo, build), [os.path.join(repo, "include"), os.path.join(repo, "client", "include")]))
    cands.append(("/usr/local/lib", ["/usr/local/include"]))
    multiarch = sysconfig.get_config_var("MULTIARCH")  # a Debian package's library (make deb): /usr/lib/<triplet>
    if multiarch:
        cands.append((os.path.join("/usr/lib", multiarch), ["/usr/include"]))
    cands.append(("/usr/lib", ["/usr/include"]))
    for lib, incs in cands:
        if os.path.exists(os.path.join(lib, "libgmlake-client.so")):
            for inc in incs:
                if os.path.exists(os.path.join(inc, "gmlake.h")):
                    return os.path.abspath(lib), os.path.abspath(inc)
    raise SystemExit("gmlake: libgmlake-client.so and gmlake.h not found: run `make` in the repository, "
                     "`make install`, or set GMLAKE_PREFIX")


def note(text):
    """Said on stderr, and left for build_backend/gmlake_build.py, which shows it on the terminal: pip shows a
    build's output only with -v."""
    sys.stderr.write(text)
    path = os.environ.get("GMLAKE_BUILD_NOTE")
    if path:
        with open(path, "a") as f:
            f.write(text)


if torch_missing:
    note("gmlake: the PyTorch extension gmlake._C is not built: %s. Installing the "
         "pure-Python package: gmlake.stats(), the growable ranges and pause/resume work through ctypes; "
         "gmlake.enable() needs PyTorch: install torch, then pip install ./python again\n" % torch_missing)
    setup(packages=["gmlake"], options=out_of_tree)
else:
    lib, inc = find()
    import torch

    class OptionalBuildExtension(BuildExtension):
        """A torch the extension cannot build against (a CPU-only or too old PyTorch: no CUDA allocator
        interface) installs the pure-Python package and says why, instead of failing the whole install."""

        def build_extension(self, ext):
            try:
                super().build_extension(ext)
            except Exception as e:  # the compiler's or torch's error: its last line names it
                why = (str(e).strip().splitlines() or [type(e).__name__])[-1]
                note("gmlake: the PyTorch extension gmlake._C did not build against torch %s (%s). Installing the "
                     "pure-Python package: gmlake.stats(), the growable ranges and pause/resume work through ctypes; "
                     "gmlake.enable() needs the extension, built against a CUDA build of PyTorch 2.x "
                     "(docs/pytorch.md)\n" % (torch.__version__, why))

    note("gmlake: building the PyTorch extension gmlake._C against torch %s (%s), libgmlake-client in %s\n"
         % (torch.__version__, os.path.dirname(torch.__file__), lib))
    setup(
        packages=["gmlake"],
        ext_modules=[CUDAExtension(
            "gmlake._C", ["gmlake/_C.cpp"],
            depends=["gmlake/_torch_ipc.h"],
            include_dirs=[inc],
            library_dirs=[lib],
            libraries=["gmlake-client", "dl"],  # dl: _torch_ipc.h loads the driver's VMM calls
            extra_link_args=["-Wl,-rpath," + lib],
            extra_compile_args={"cxx": ["-O2"] + os.environ.get("GMLAKE_EXT_DEFINES", "").split()},
        )],
        cmdclass={"build_ext": OptionalBuildExtension},
        options=out_of_tree,
    )
