# Sourced by rlpost.interop.shell before a launch script: every command the script would run
# outside bash is recorded instead of run. PATH names an empty folder, so an external command
# reaches command_not_found_handle; builtins with effects outside the shell are shadowed by
# functions; a DEBUG trap skips commands named by path and writes to files.
#
# Each record is a file in the folder $RLPOST_RECORD, named by time, process and a counter
# (commands of one pipeline run at once), holding NUL-separated fields: a kind, then words.
# Kinds: run (a command, recorded), path (a command named by path, not run), write (a
# redirection to a file, not made), source (a file read), train (a command naming train.py:
# the count of its words, the words, then the exported environment as NAME=VALUE), exit (the
# status the script ended with).

__rlpost_count=0
__rlpost_emit() {
    __rlpost_count=$((__rlpost_count + 1))
    printf '%s\0' "$@" >"$RLPOST_RECORD/${EPOCHREALTIME/[.,]/}.$BASHPID.$__rlpost_count"
    return 0
}

# A train command is recorded with the exported environment it would run in.
__rlpost_train() {
    local name words=()
    for name in $(compgen -e); do
        case $name in RLPOST_* | PATH | PWD | OLDPWD | SHLVL | _) continue ;; esac
        words+=("$name=${!name}")
    done
    __rlpost_emit train "$#" "$@" "${words[@]}"
}

# What the script sees of the GPUs: RLPOST_GPUS_PER_NODE H100s joined by NVLink.
__rlpost_nvidia_smi() {
    local i j row
    if [[ " $* " == *" topo "* ]]; then
        for ((i = 0; i < RLPOST_GPUS_PER_NODE; i++)); do
            row="GPU$i"
            for ((j = 0; j < RLPOST_GPUS_PER_NODE; j++)); do
                ((i == j)) && row+=$'\t X' || row+=$'\tNV18'
            done
            printf '%s\n' "$row"
        done
    elif [[ " $* " == *" -L "* ]]; then
        for ((i = 0; i < RLPOST_GPUS_PER_NODE; i++)); do
            printf 'GPU %d: NVIDIA H100 80GB HBM3 (UUID: GPU-%d)\n' "$i" "$i"
        done
    elif [[ " $* " == *" --query-gpu"* ]]; then
        for ((i = 0; i < RLPOST_GPUS_PER_NODE; i++)); do printf '%d\n' "$i"; done
    fi
}

command_not_found_handle() {
    local word kind=run
    for word in "$@"; do
        case ${word##*/} in train.py | train_async.py) kind=train && break ;; esac
    done
    [[ $kind == train ]] && __rlpost_train "$@" || __rlpost_emit run "$@"
    case $1 in
    nvidia-smi) __rlpost_nvidia_smi "${@:2}" ;;
    # text tools in pipelines over probes: the stand-ins below, in bash
    dirname | basename | wc | tr | grep | head | cat | hostname | awk) "__rlpost_$1" "${@:2}" ;;
    esac
    return 0
}

__rlpost_dirname() {
    local path=${1:-.}
    [[ $1 == -- ]] && path=${2:-.}
    [[ $path == */* ]] && path=${path%/*} || path=.
    printf '%s\n' "${path:-/}"
}

__rlpost_basename() {
    local path=$1
    [[ $1 == -- ]] && path=$2
    path=${path##*/}
    printf '%s\n' "${path%"${3:-${2:-}}"}"
}

__rlpost_wc() {
    local n=0 line
    while IFS= read -r line || [[ -n $line ]]; do n=$((n + 1)); done
    printf '%d\n' "$n"
}

__rlpost_tr() {
    local text
    text=$(__rlpost_cat)
    if [[ $1 == -d ]]; then
        text=${text//["$2"]/}
    elif [[ ${#1} == 1 && ${#2} -le 2 ]]; then # one character for another (`tr ',' '\n'`)
        local to=$2
        [[ $to == '\n' ]] && to=$'\n'
        text=${text//"$1"/"$to"}
    fi
    printf '%s\n' "$text"
}

__rlpost_grep() {
    local only=0 count=0 quiet=0 pattern line n=0
    while [[ $1 == -* ]]; do
        [[ $1 == *o* ]] && only=1
        [[ $1 == *c* ]] && count=1
        [[ $1 == *q* ]] && quiet=1
        shift
    done
    pattern=$1
    while IFS= read -r line || [[ -n $line ]]; do
        while [[ $line =~ $pattern ]]; do
            n=$((n + 1))
            ((only && !count && !quiet)) && printf '%s\n' "${BASH_REMATCH[0]}"
            ((only)) || break
            line=${line#*"${BASH_REMATCH[0]}"}
        done
        ((!only && !count && !quiet && n)) && printf '%s\n' "$line"
    done
    ((count)) && printf '%d\n' "$n"
    ((n > 0))
}

__rlpost_head() {
    local line
    IFS= read -r line && printf '%s\n' "$line"
}

# stdin only (a here-document, a pipe): files are not read
__rlpost_cat() {
    local line
    [[ $# -gt 0 && $1 != - ]] && return 0
    while IFS= read -r line || [[ -n $line ]]; do printf '%s\n' "$line"; done
}

# `awk '{print $N}' [FILE]` only (a hostfile's addresses); any other program prints nothing
__rlpost_awk() {
    local line fields
    [[ $1 =~ ^\{[[:space:]]*print[[:space:]]+\$([0-9]+)[[:space:]]*\}$ ]] || return 0
    local n=${BASH_REMATCH[1]}
    while IFS= read -r line || [[ -n $line ]]; do
        read -ra fields <<<"$line"
        ((n == 0)) && printf '%s\n' "$line" || printf '%s\n' "${fields[n - 1]:-}"
    done < <([[ -n ${2:-} ]] && printf '%s\n' "$(<"$2")" || __rlpost_cat)
}

__rlpost_hostname() { printf '%s\n' "${MASTER_ADDR:-127.0.0.1}"; }

# Builtins that act outside the shell, or find commands around the stand-ins. `builtin X`
# for these is refused by the guard below.
kill() { __rlpost_emit run kill "$@"; }
exec() { (($#)) && __rlpost_emit run exec "$@"; return 0; }
trap() { __rlpost_emit run trap "$@"; }
enable() { __rlpost_emit run enable "$@"; }
ulimit() { __rlpost_emit run ulimit "$@"; }
disown() { __rlpost_emit run disown "$@"; }
hash() { __rlpost_emit run hash "$@"; }
command() {
    case $1 in
    -v | -V) printf '%s\n' "$2" ;; # every command is there: its stand-in answers
    -p) shift && "$@" ;;
    *) "$@" ;;
    esac
}
# errexit, nounset and xtrace are left off: a probe that a stand-in answers must not end the
# evaluation early
set() {
    local words=() word option=0
    for word in "$@"; do
        if ((option)); then
            option=0
            case $word in errexit | nounset | xtrace) continue ;; esac
            words+=(-o "$word")
            continue
        fi
        case $word in
        -o | +o) option=1 ;;
        -- | - | +) words+=("$word") ;;
        [-+]*) word=${word//[eux]/} && ((${#word} > 1)) && words+=("$word") ;;
        *) words+=("$word") ;;
        esac
    done
    ((${#words[@]} == 0)) || builtin set "${words[@]}"
    return 0
}

# A sourced file the script's folder lacks (a slime checkout's scripts/models/*.sh) is read
# from RLPOST_SOURCE_DIRS by name.
__rlpost_source() {
    local target=$1 dir
    if [[ ! -f $target ]]; then
        for dir in $RLPOST_SOURCE_DIRS; do
            [[ -f $dir/${target##*/} ]] && target=$dir/${target##*/} && break
        done
    fi
    if [[ ! -f $target ]]; then
        __rlpost_emit run source "$@"
        return 1
    fi
    shift
    __rlpost_emit source "$target"
    builtin source "$target" "$@"
}
source() { __rlpost_source "$@"; }
.() { __rlpost_source "$@"; }

# The next shell word of $1 (quotes and escapes kept) into __rlpost_word, the rest into
# __rlpost_rest.
__rlpost_split() {
    local text=$1 word="" quote="" c
    text=${text#"${text%%[![:space:]]*}"}
    while [[ -n $text ]]; do
        c=${text:0:1}
        if [[ $c == \\ && $quote != \' ]]; then
            word+=${text:0:2}
            text=${text:2}
            continue
        elif [[ -n $quote ]]; then
            [[ $c == "$quote" ]] && quote=""
        elif [[ $c == \" || $c == \' ]]; then
            quote=$c
        elif [[ $c == [[:space:]] ]]; then
            break
        fi
        word+=$c
        text=${text:1}
    done
    __rlpost_word=$word
    __rlpost_rest=$text
}

# The command word of a simple command as bash will run it, into __rlpost_first: the
# assignments before it passed over, quotes removed, and $NAME, ${NAME}, ${NAME[@]} or
# ${NAME:-literal} expanded; "?" when it is computed otherwise (a command substitution, another expansion),
# which the guard does not run; empty for an assignment alone.
__rlpost_command_word() {
    local text=$1 word name default
    while :; do
        __rlpost_split "$text"
        word=$__rlpost_word text=$__rlpost_rest
        [[ $word =~ ^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=(.?) ]] || break
        if [[ ${BASH_REMATCH[2]} == "(" ]]; then # an array assignment: no command
            word=""
            break
        fi
    done
    word=${word//[\"\'\\]/}
    if [[ $word =~ ^\$\{?([A-Za-z_][A-Za-z0-9_]*)(\[[@*0]\])?(:-([^\$\`\}]*))?\}?$ ]]; then
        name=${BASH_REMATCH[1]} default=${BASH_REMATCH[4]} # an array: its first item
        word=${!name:-$default}
    elif [[ $word == *[\$\`]* ]]; then
        word="?"
    fi
    __rlpost_first=$word
    __rlpost_split "$text"
}

# Commands named by path (or by an expansion the guard cannot see through) and writes to
# files are skipped, and recorded.
__rlpost_guard() {
    case ${FUNCNAME[1]:-} in __rlpost_* | command_not_found_handle | set) return 0 ;; esac
    local text=$BASH_COMMAND first rest
    __rlpost_command_word "$text"
    first=$__rlpost_first rest=$__rlpost_word
    if [[ $first == builtin ]]; then
        case $rest in
        kill | exec | trap | enable | ulimit | disown | hash | command | builtin)
            __rlpost_emit run "$text"
            return 1
            ;;
        esac
    fi
    if [[ $first == */* || $first == "?" ]]; then
        __rlpost_emit path "$text"
        return 1
    fi
    if [[ $text =~ (^|[[:space:]])[0-9\&]?\>\>?[[:space:]]*([^\&[:space:]][^[:space:]]*) ]]; then
        case ${BASH_REMATCH[2]} in
        /dev/null | /dev/stdout | /dev/stderr | \"/dev/null\") ;;
        *)
            __rlpost_emit write "$text"
            return 1
            ;;
        esac
    fi
    return 0
}

__rlpost_done() { __rlpost_emit exit "$1"; }
