#!/usr/bin/env bash
# Runs every test of Strata on a fresh Debian machine: installs what the tests need (protoc and
# the well-known .proto files for the etcd-client crate's build script, etcd 3.4 and etcdctl as
# the reference implementation and the operator's client, moto as the S3-compatible server, PyYAML
# and python-hcl2 for the deployment manifests' checks), then
# checks formatting and lints, builds, and runs the whole test suite.
#
#   scripts/test.sh            # everything
#   scripts/test.sh -p strata-memstore   # extra arguments go to `cargo test`
#
# Set STRATA_SKIP_INSTALL=1 to skip the package installation step.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n=== %s\n' "$*"; }

install_deps() {
  local apt_pkgs=()
  command -v protoc >/dev/null 2>&1 || apt_pkgs+=(protobuf-compiler)
  [ -f /usr/include/google/protobuf/descriptor.proto ] || apt_pkgs+=(libprotobuf-dev)
  command -v etcdctl >/dev/null 2>&1 || apt_pkgs+=(etcd-client)
  command -v etcd >/dev/null 2>&1 || apt_pkgs+=(etcd-server)
  # etcd's JSON gateway is tested with curl, as etcd's documentation drives it.
  command -v curl >/dev/null 2>&1 || apt_pkgs+=(curl)
  if [ ${#apt_pkgs[@]} -gt 0 ]; then
    log "installing Debian packages: ${apt_pkgs[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    # RUNLEVEL=1 keeps the etcd-server package from starting a system etcd on :2379.
    $sudo env RUNLEVEL=1 DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${apt_pkgs[@]}"
  fi
  if ! command -v moto_server >/dev/null 2>&1; then
    log "installing moto (S3-compatible server for the object-storage tests)"
    python3 -m pip install --quiet 'moto[s3]>=5.2,<6' flask flask-cors
  fi
  if ! python3 -c 'import yaml, hcl2' >/dev/null 2>&1; then
    log "installing PyYAML and python-hcl2 (the deployment manifests' checks parse YAML and HCL)"
    python3 -m pip install --quiet 'pyyaml>=6,<7' 'python-hcl2>=7,<9'
  fi
}

[ "${STRATA_SKIP_INSTALL:-0}" = 1 ] || install_deps

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# Integration tests start whole clusters of processes: on small machines run few at once.
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-2}"

log "cargo fmt --check"
cargo fmt --all -- --check

log "cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

log "cargo build (the strata binary the process tests start)"
cargo build --workspace --locked

log "cargo test"
cargo test --workspace --locked "$@"
