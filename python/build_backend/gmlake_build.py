"""gmlake's PEP 517 build backend: setuptools' own, run with the interpreter's installed packages in view.

pip builds in an isolated environment by default: it installs what [build-system] requires from the
package index into an empty one and hides the interpreter's site-packages. The extension gmlake._C must be
built against the torch the user has (not a second one downloaded for the build), and `pip install
--no-index ./python` must work offline, so [build-system] requires nothing and this backend puts the
interpreter's own site-packages (system, then user) back on sys.path before it loads setuptools: the
build sees the setuptools, wheel and torch that are installed, with or without --no-build-isolation.
Where setuptools itself is missing, the error says what to install.
setup.py decides whether the extension is built (torch importable) and says so on stderr; pip shows a
build's output only with -v, so this also writes that line to the terminal (/dev/tty) when there is one.
"""
import os
import site
import sys


def _installed_paths():
    paths = []
    try:
        paths += site.getsitepackages()
    except AttributeError:  # an old virtualenv's site module
        pass
    if sys.prefix != getattr(sys, "base_prefix", sys.prefix) and _venv_sees_system():
        paths += [p.replace(sys.prefix, sys.base_prefix, 1) for p in site.getsitepackages()]
    user = site.getusersitepackages() if site.ENABLE_USER_SITE is not False else None
    if user:
        paths.append(user)
    return [p for p in paths if os.path.isdir(p)]


def _venv_sees_system():
    cfg = os.path.join(sys.prefix, "pyvenv.cfg")
    try:
        with open(cfg) as f:
            return any(l.replace(" ", "").lower().startswith("include-system-site-packages=true") for l in f)
    except OSError:
        return False


for _p in _installed_paths():
    if _p not in sys.path:
        sys.path.append(_p)  # after pip's own build environment: what it installed (if anything) wins

try:
    from setuptools import build_meta as _meta
except ImportError as e:
    raise SystemExit("gmlake: cannot build: setuptools is not installed in this Python (%s): %s. Install it "
                     "(Debian: apt install python3-setuptools python3-wheel; else pip install setuptools wheel) and "
                     "run pip install ./python again" % (sys.executable, e))


def _tell_terminal():
    """setup.py leaves its verdict in GMLAKE_BUILD_NOTE's file: shown on the terminal, pip or not."""
    note = os.environ.get("GMLAKE_BUILD_NOTE")
    if not note or not os.path.exists(note):
        return
    with open(note) as f:
        text = f.read()
    os.unlink(note)
    try:
        with open("/dev/tty", "w") as tty:
            tty.write(text)
    except OSError:
        pass  # no terminal (CI, a pipe): stderr has it, which pip shows with -v and on failure


def _with_note(hook):
    def run(*args, **kwargs):
        import tempfile
        fd, path = tempfile.mkstemp(prefix="gmlake-note-")
        os.close(fd)
        os.environ["GMLAKE_BUILD_NOTE"] = path
        try:
            return hook(*args, **kwargs)
        finally:
            _tell_terminal()
            if os.path.exists(path):
                os.unlink(path)
    run.__name__ = hook.__name__
    return run


def _wheel_requires(hook):
    """setuptools before 70.1 asks pip for `wheel` (its bdist_wheel): none where it is installed already, so an
    isolated build downloads nothing (offline, pip would fail looking for it)."""
    def run(config_settings=None):
        try:
            import wheel  # noqa: F401
            return [r for r in hook(config_settings) if not r.startswith("wheel")]
        except ImportError:
            return hook(config_settings)
    run.__name__ = hook.__name__
    return run


get_requires_for_build_wheel = _wheel_requires(_meta.get_requires_for_build_wheel)
get_requires_for_build_sdist = _meta.get_requires_for_build_sdist
prepare_metadata_for_build_wheel = _meta.prepare_metadata_for_build_wheel
build_sdist = _meta.build_sdist
build_wheel = _with_note(_meta.build_wheel)
if hasattr(_meta, "build_editable"):
    get_requires_for_build_editable = _wheel_requires(_meta.get_requires_for_build_editable)
    prepare_metadata_for_build_editable = _meta.prepare_metadata_for_build_editable
    build_editable = _with_note(_meta.build_editable)
