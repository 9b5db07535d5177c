"""The program that runs ON the CT's host for every config read and write (``python3 -I -c``).

Stdlib only, no gpudoctor import: it is sent as ``-c`` text, so nothing needs to be
installed on the host. ``write`` does, under the config lock (Proxmox's own, held by the
caller's ``flock``; or gpudoctor's own, in its private lock directory, passed as the fifth
argument: taken here with ``flock`` after checking that the path still names the file it
opened, and unlinked while still held as the program ends, so ``/run/gpudoctor`` does not
keep one file per CT forever): compare the file's
SHA-1 with the plan's (exit :data:`RC_CHANGED`), clear ``<conf>.tmp.*`` left by killed
writers, back the old bytes up (``.part`` + rename), write ``<conf>.tmp.<pid>``
(``O_CREAT|O_EXCL|O_NOFOLLOW``: a name another user planted in a user-owned lxcpath after
the sweep is an error, never written through) + fsync + rename, and read it back; a read-back that differs puts the old bytes back the same way
(exit :data:`RC_VERIFY`, or :data:`RC_VERIFY_UNRESTORED` when even that failed).
"""

from __future__ import annotations

LOCK_WAIT_S = 10
LOCK_BUSY_RC = 75
RC_CHANGED = 10
RC_VERIFY = 11
RC_MISSING = 12
RC_VERIFY_UNRESTORED = 13

# Runs ON the CT's host (python3 -I -c). argv: op, then op arguments; data on stdin.
HOST_PROGRAM = r"""
import base64, glob, hashlib, json, os, sys
op, conf = sys.argv[1], sys.argv[2]
def sha(b): return hashlib.sha1(b).hexdigest()
def fsync_write(path, data, mode, fresh=False):
    # never through a link another user planted (a user-owned --lxcpath); a temp file is
    # created, never reused: O_EXCL (a name planted after the sweep below is an error)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_EXCL if fresh else os.O_TRUNC)
    fd = os.open(path, flags, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        try:
            os.fsync(fd)
        except OSError as exc:  # a filesystem without fsync (EINVAL/ENOSYS): nothing to flush
            if exc.errno not in (22, 38, 95):
                raise
    finally:
        os.close(fd)
lock = sys.argv[5] if op == 'write' and len(sys.argv) > 5 else '-'
if lock != '-':  # gpudoctor's own lock: taken here, and removed as it is released
    import atexit, fcntl, time
    deadline = time.monotonic() + @LOCK_WAIT_S@
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    sys.exit(@LOCK_BUSY_RC@)
                time.sleep(0.05)
        try:  # the holder before us may have removed the file we locked: take the new one
            now = os.stat(lock, follow_symlinks=False)
        except FileNotFoundError:
            now = None
        mine = os.fstat(fd)
        if now is not None and (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
            break
        os.close(fd)
    def release(fd=fd):
        try:
            os.unlink(lock)  # still held: nobody can have locked this file meanwhile
        except FileNotFoundError:
            pass
        os.close(fd)
    atexit.register(release)
try:
    old = open(conf, 'rb').read()
except FileNotFoundError:
    old = None
if op == 'read':
    if old is None:
        print('missing'); sys.exit(12)
    print(json.dumps({'sha1': sha(old), 'data': base64.b64encode(old).decode()}))
    sys.exit(0)
expected, backup = sys.argv[3], sys.argv[4]
if old is None and expected != 'absent':
    print('missing'); sys.exit(12)
if (sha(old) if old is not None else 'absent') != expected:
    print(json.dumps({'sha1': sha(old)})); sys.exit(10)
new = base64.b64decode(sys.stdin.read())
for stale in glob.glob(glob.escape(conf) + '.tmp.*'):
    os.unlink(stale)
if backup != '-' and old is not None:
    os.makedirs(os.path.dirname(backup), mode=0o700, exist_ok=True)
    fsync_write(backup + '.part', old, 0o600)
    os.rename(backup + '.part', backup)
mode = os.stat(conf).st_mode & 0o7777 if old is not None else 0o644
tmp = conf + '.tmp.' + str(os.getpid())
fsync_write(tmp, new, mode, fresh=True)
os.rename(tmp, conf)
check = open(conf, 'rb').read()
reply = {'old_sha1': expected, 'new_sha1': sha(check), 'tmp': tmp}
if check != new:  # the read-back differs: put the old bytes back the same way
    restored = False
    if old is not None:
        try:
            fsync_write(tmp, old, mode, fresh=True)
            os.rename(tmp, conf)
            restored = open(conf, 'rb').read() == old
        except OSError:
            restored = False
    reply['restored'] = restored
    print(json.dumps(reply)); sys.exit(11 if restored else 13)
print(json.dumps(reply))
sys.exit(0)
""".replace("@LOCK_WAIT_S@", str(LOCK_WAIT_S)).replace("@LOCK_BUSY_RC@", str(LOCK_BUSY_RC))
