"""Runs inside an executor (`cloud-harness exec WS -- python3 - ARGS < probe.py`) and reports
what a hostile script could do there, as one JSON document on stdout.

    probe.py SKILL_FILE LOOPBACK_PORT SECRET HOST_PATH...
"""

import errno
import json
import os
import resource
import socket
import sys

skill_file, port, secret, host_paths = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
out = {}


def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))


def writes(root, skill):
    """Every kind of write call, aimed at a skill folder of a read-only mount."""
    d = os.path.join(root, skill)
    f = os.path.join(d, "SKILL.md")
    return {
        "create": attempt(lambda: os.close(os.open(os.path.join(d, "new"), os.O_CREAT | os.O_WRONLY, 0o644))),
        "write": attempt(lambda: os.close(os.open(f, os.O_WRONLY))),
        "unlink": attempt(lambda: os.unlink(f)),
        "rename": attempt(lambda: os.rename(f, os.path.join(d, "moved"))),
        "mkdir": attempt(lambda: os.mkdir(os.path.join(root, "new-dir"))),
        "rmdir": attempt(lambda: os.rmdir(d)),
        "chmod": attempt(lambda: os.chmod(f, 0o777)),
        "truncate": attempt(lambda: os.truncate(f, 0)),
        "symlink": attempt(lambda: os.symlink("/etc/passwd", os.path.join(d, "link"))),
        "link": attempt(lambda: os.link(f, os.path.join(d, "hard"))),
        "setxattr": attempt(lambda: os.setxattr(f, "user.evil", b"1")),
        "utimes": attempt(lambda: os.utime(f, (0, 0))),
    }


skill = os.path.basename(os.path.dirname(skill_file))
out["skillsWrites"] = writes("/opt/cloud-harness/skills", skill)
out["ownerWrites"] = writes("/opt/cloud-harness/owner-skills", skill)
out["readSkill"] = open(skill_file).read()
out["ownerListing"] = sorted(os.listdir("/opt/cloud-harness/owner-skills"))

status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
out["uid"] = os.getuid()
out["euid"] = os.geteuid()
out["capabilities"] = {k: status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
out["noNewPrivs"] = status.get("NoNewPrivs", "").strip()
out["cwd"] = os.getcwd()

s = socket.socket()
s.settimeout(3)
out["loopbackConnect"] = attempt(lambda: s.connect(("127.0.0.1", port)))
routes = open("/proc/net/route").read().splitlines()[1:]
out["ipv4Routes"] = [r.split()[0] for r in routes]
out["ipv6Routes"] = [l.split()[-1] for l in open("/proc/net/ipv6_route").read().splitlines()] if os.path.exists("/proc/net/ipv6_route") else []
out["interfaces"] = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:])

out["hostPaths"] = {p: attempt(lambda p=p: os.stat(p)) for p in host_paths}
leaks = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            if secret.encode() in open(f"/proc/{pid}/environ", "rb").read():
                leaks.append(pid)
        except OSError:
            pass
out["environLeaks"] = leaks
out["workspaceWrite"] = attempt(lambda: open("/workspace/probe-was-here", "w").close())
out["tmpWrite"] = attempt(lambda: open("/tmp/probe", "w").close())
out["rootWrite"] = attempt(lambda: open("/probe", "w").close())
out["usrWrite"] = attempt(lambda: open("/usr/probe", "w").close())


def cgroup(*names):
    """The first of these cgroup files there is (cgroup v2, then v1)."""
    for name in names:
        try:
            return open(f"/sys/fs/cgroup/{name}").read().strip()
        except OSError:
            pass
    return None


tmp = os.statvfs("/tmp")
out["limits"] = {
    "nproc": resource.getrlimit(resource.RLIMIT_NPROC)[0],
    "pidsMax": cgroup("pids.max", "pids/pids.max"),
    "memoryMax": cgroup("memory.max", "memory/memory.limit_in_bytes"),
    "tmpBytes": tmp.f_blocks * tmp.f_frsize,
}
print(json.dumps(out))
