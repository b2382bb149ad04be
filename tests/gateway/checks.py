"""The check counter the gateway's Python tests share, printed the way the C
harness prints its own ("N checks, M failures")."""

n_checks = 0
n_failures = 0


def check(ok, what):
    """Count one check; print what failed. Returns ok, so a caller can skip
    what depends on it."""
    global n_checks, n_failures
    n_checks += 1
    if not ok:
        n_failures += 1
        print(f"FAIL: {what}", flush=True)
    return ok


def summary():
    """Print the counts; the exit code: 1 when any check failed."""
    print(f"{n_checks} checks, {n_failures} failures")
    return 1 if n_failures else 0
