#!/bin/sh
# Writes target/driver.jsa, the class archive the conformance driver starts
# from: runs the driver's warm-up (every acquire path once) against a
# throwaway redis-server with -XX:ArchiveClassesAtExit. Without redis-server
# (or LOCK_SERVER) it writes none, and the driver starts without it.
here=$(cd "$(dirname "$0")" && pwd)
server=${LOCK_SERVER:-redis-server}
command -v "$server" >/dev/null 2>&1 || { echo "cds-archive: no $server, no class archive"; exit 0; }
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
module=""
[ -n "$LOCK_MODULE" ] && [ -f "$LOCK_MODULE" ] && module="--loadmodule $LOCK_MODULE"
"$server" --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" $module >/dev/null 2>&1 &
pid=$!
sleep 0.5
rm -f "$here/target/driver.jsa"
java -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xlog:disable -Xlog:all=error:stderr \
  -XX:ArchiveClassesAtExit="$here/target/driver.jsa" \
  -cp "$here/target/redislock-0.1.0.jar:$(cat "$here/target/classpath.txt")" \
  io.redislock.conformance.Driver --warm "redis://127.0.0.1:$port" 2>/dev/null
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
rm -rf "$dir"
[ -f "$here/target/driver.jsa" ] && echo "cds-archive: target/driver.jsa" || echo "cds-archive: none written"
