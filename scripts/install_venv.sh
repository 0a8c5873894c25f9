# Sourced by scripts/demo.sh and scripts/test.sh: the project, editable, in .venv of the checkout.
# Installs only when .venv lacks it or pyproject.toml (the dependencies) changed since the last
# install, so a second run starts at once; pip's own output (setuptools' boxed notice about
# editable installs among it) is kept in .venv/install.log and shown only when pip fails.
# Usage: install_venv EXTRA   (EXTRA: "" for the product alone, "test" for the suite's tools)
install_venv() {
    local extra=$1 spec=. python=${PYTHON:-python3}
    [ -n "$extra" ] && spec=".[$extra]"
    if [ ! -x .venv/bin/python ]; then
        "$python" -m venv .venv
    elif ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
        # A first run stopped while venv was still installing pip leaves a .venv without it, and
        # every later run would fail on `No module named pip`: make it again.
        echo ".venv has no pip (an earlier install was interrupted?): making it again" >&2
        "$python" -m venv --clear .venv
    fi
    local want stamp=.venv/.topo-installed
    want="$(sha256sum pyproject.toml | cut -d' ' -f1) $spec"
    if [ -f "$stamp" ] && grep -qxF "$want" "$stamp" && .venv/bin/python -c 'import plugin' 2>/dev/null; then
        return 0
    fi
    if ! { .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip &&
           .venv/bin/python -m pip install -q --disable-pip-version-check -e "$spec"; } >.venv/install.log 2>&1; then
        cat .venv/install.log >&2
        echo "installing the project into .venv failed (pip's output above, also in .venv/install.log)" >&2
        return 1
    fi
    # A test install also satisfies the demo; the demo's install does not satisfy the tests.
    { [ "$spec" = . ] || echo "$(sha256sum pyproject.toml | cut -d' ' -f1) ."; echo "$want"; } >"$stamp"
}
