# shellcheck shell=bash
# Helpers shared by the launch scripts: --dry-run and quoting.

DRY_RUN="${DRY_RUN:-0}"

# A word as a shell would need it quoted, readable for plain words.
shell_quote() {
  if [[ "$1" =~ ^[A-Za-z0-9_./:=,@%+~-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}

# All arguments quoted and joined by spaces.
quote_all() {
  local out="" word
  for word in "$@"; do
    out+="${out:+ }$(shell_quote "$word")"
  done
  printf '%s' "$out"
}

# Prints the command, then runs it unless DRY_RUN=1.
run() {
  printf '+ %s\n' "$(quote_all "$@")"
  if [[ "$DRY_RUN" != 1 ]]; then
    "$@"
  fi
}

die() {
  printf 'error: %s\n' "$*" >&2
  exit 1
}
