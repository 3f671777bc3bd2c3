"""Pause and resume: give this process's GPU memory back to the lake between
steps (an RL trainer while the rollout engine runs, a server between bursts)
while every tensor and pointer stays valid (libgmlake-client's gml_pause /
gml_resume).

    gmlake.pause()                 # content saved to pinned host memory, chunks back to the lake
    ...                            # other processes use the memory
    gmlake.resume()                # same addresses, same bytes

    with gmlake.paused(discard=True):   # KV caches, activations: nothing saved
        ...

    with gmlake.tagged(7):         # allocations made here carry tag 7
        kv = torch.empty(...)
    gmlake.pause(tag=7)            # only those are paused

pause() waits for the device to finish first. Do not touch paused tensors until
resume() (on the host backend they are unmapped: SIGSEGV). Allocation goes on
while paused (it leases memory as usual, never at a paused tensor's address);
resume() that the lake cannot serve raises GMLakeError with the rest still
paused: call it again; resume() with nothing paused raises GMLakeError ("not
paused"), as a second pause() does. path= saves the content to that file (created 0600,
removed at resume) instead of host memory.

No torch is needed here: the client is the device's (gmlake.enable()'s) or
the `client` given (a gml_client pointer, e.g. from gml_open through ctypes).
"""
import contextlib
import ctypes
import os

from . import GMLakeError, _device, _int_in, _load

__all__ = ["pause", "resume", "paused", "set_tag", "tagged", "PAUSE_DISCARD", "PAUSE_FILE"]

PAUSE_DISCARD = 1  # gmlake.h GML_PAUSE_DISCARD
PAUSE_FILE = 2     # gmlake.h GML_PAUSE_FILE

_declared = False


def _lib():
    global _declared
    lib = _load()
    if not _declared:
        lib.gml_pause.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint32]
        lib.gml_pause_file.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint32, ctypes.c_char_p]
        lib.gml_resume.argtypes = [ctypes.c_void_p]
        lib.gml_set_tag.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
        lib.gml_last_error.argtypes = [ctypes.c_void_p]
        lib.gml_last_error.restype = ctypes.c_char_p
        lib.gml_strerror.argtypes = [ctypes.c_int]
        lib.gml_strerror.restype = ctypes.c_char_p
        _declared = True
    return lib


def _client(device, client):
    if client is not None:
        return client
    lib = _lib()
    get = getattr(lib, "gml_device_client_if_open", None)
    if get is None:
        raise GMLakeError("this libgmlake-client has no device clients: pass client=")
    get.argtypes = [ctypes.c_int]
    get.restype = ctypes.c_void_p
    device = _device(device)
    c = get(device)
    if not c:
        raise GMLakeError("no GMLake client is open on device %d (gmlake.enable() and allocate first, or "
                          "gmlake.open(%d) without torch)" % (device, device))
    return c


def _check(rc, what, c):
    if rc != 0:
        lib = _lib()
        raise GMLakeError("%s: %s: %s" % (what, lib.gml_strerror(rc).decode(), lib.gml_last_error(c).decode()))


def pause(discard=False, tag=0, path=None, device=None, client=None):
    """Save the content of the live allocations (those of `tag` when not 0),
    give their memory back to the lake, keep their addresses."""
    tag = _int_in(tag, 0, 2**32 - 1, "tag")  # a uint32_t: 2**32 was tag 0, every allocation
    c = _client(device, client)
    flags = PAUSE_DISCARD if discard else 0
    if path is not None:
        # str, bytes or os.PathLike, as open() takes them (str(b"x") made a file named "b'x'"), and no NUL
        # (C would stop at it: another file than the one named)
        p = os.fsencode(path)
        if b"\0" in p:
            raise ValueError("gmlake.pause: path has an embedded null byte")
        _check(_lib().gml_pause_file(c, flags | PAUSE_FILE, tag, p), "gmlake.pause", c)
    else:
        _check(_lib().gml_pause(c, flags, tag), "gmlake.pause", c)


def resume(device=None, client=None):
    """Lease memory again, map it at the same addresses, restore the content (GMLakeError: nothing paused)."""
    c = _client(device, client)
    _check(_lib().gml_resume(c), "gmlake.resume", c)


@contextlib.contextmanager
def paused(discard=False, tag=0, path=None, device=None, client=None):
    """pause() on entry, resume() on exit (also when the body raises)."""
    pause(discard=discard, tag=tag, path=path, device=device, client=client)
    try:
        yield
    finally:
        resume(device=device, client=client)


def set_tag(tag, device=None, client=None):
    """Allocations from now on carry `tag` (0: none); pause(tag=...) takes only those."""
    tag = _int_in(tag, 0, 2**32 - 1, "tag")
    c = _client(device, client)
    _check(_lib().gml_set_tag(c, tag), "gmlake.set_tag", c)


@contextlib.contextmanager
def tagged(tag, device=None, client=None):
    """Allocations made inside carry `tag`; the tag is 0 again on exit."""
    set_tag(tag, device=device, client=client)
    try:
        yield
    finally:
        set_tag(0, device=device, client=client)
