# Sourced by scripts/setup.sh and .ci/run: find_python X.Y prints a command for Python X.Y
# that can make virtualenvs (python3.13 on PATH, Debian's /usr/bin, /usr/local/bin, or a
# pyenv build), or fails.
find_python() {
  local version="$1" candidate
  for candidate in "python$version" "/usr/bin/python$version" "/usr/local/bin/python$version" \
    "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$version"*/bin/"python$version"; do
    if "$candidate" -c 'import venv, ensurepip, ssl, sqlite3' >/dev/null 2>&1; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}
