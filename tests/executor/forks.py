# Processes (each a `sleep`, small) until the executor refuses one; how many, and why.
import errno, json, os, signal
pids, error = [], None
while len(pids) < 1100:
    try:
        pids.append(os.posix_spawn('/bin/sleep', ['sleep', '30'], {}))
    except OSError as e:
        error = errno.errorcode.get(e.errno, str(e))
        break
for pid in pids:
    os.kill(pid, signal.SIGKILL)
print(json.dumps({'spawned': len(pids), 'error': error}))
