#!/bin/sh
# Render an ACL template (users.acl) to stdout: comment and blank lines
# dropped (Redis ACL files have none), each ${NAME} replaced with the
# environment variable NAME. Each must be set, non-empty and made of
# [A-Za-z0-9_-] (an ACL line splits at spaces; `openssl rand -hex 32` makes
# one): anything else stops the render, so Redis never starts with a role
# whose password is empty or mangled.
# Usage: render-acl.sh users.acl > /data/users.acl
set -eu
awk '
/^#/ || /^[[:space:]]*$/ { next }
{
    line = $0
    out = ""
    while (match(line, /\$\{[A-Za-z_][A-Za-z0-9_]*\}/)) {
        name = substr(line, RSTART + 2, RLENGTH - 3)
        value = ENVIRON[name]
        if (value == "" || value ~ /[^A-Za-z0-9_-]/) {
            printf "render-acl: %s must be set to [A-Za-z0-9_-]+\n", name > "/dev/stderr"
            exit 1
        }
        out = out substr(line, 1, RSTART - 1) value
        line = substr(line, RSTART + RLENGTH)
    }
    print out line
}' "$1"
