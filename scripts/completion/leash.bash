# bash completion for leash                                    -*- shell-script -*-
#
# Installed as share/bash-completion/completions/leash (bash-completion loads it the first
# time `leash` is completed); without bash-completion, `source` it from ~/.bashrc.
#
# Nothing here lists a command or an option: both come from the binary's own --help, so the
# completion cannot drift from the leash being completed. `leash --help` lists the commands
# ("commands:"), and `leash COMMAND --help` ends with an "environment:" list that leash
# prints from the command's option table (one "  LEASH_X   --option" line per option, with
# " (switch)" for options without a value). What an option's value is comes from the option's
# line in the help text ("  --lua-path DIR ..."): DIR completes folders, F, FILE, SCRIPT and
# *.jsonl names complete files. --help output is cached per binary and command for the shell's
# life (it never connects to a database: --help is answered before anything else).

# _leash_reply COMPGEN-ARGS...: COMPREPLY from compgen, one word a line (names with spaces
# stay whole).
_leash_reply()
{
    mapfile -t COMPREPLY < <(compgen "$@")
}

# _leash_files: the words are file names: bash quotes them and adds '/' to folders.
_leash_files()
{
    type compopt >/dev/null 2>&1 && compopt -o filenames 2>/dev/null
    return 0
}

# _leash_help BINARY [COMMAND]: that --help text, cached.
_leash_help()
{
    local key="$1"$'\x1f'"${2-}"
    [[ ${_leash_help_cache+set} ]] || declare -gA _leash_help_cache
    if [[ -z ${_leash_help_cache[$key]+set} ]]; then
        _leash_help_cache[$key]=$(LC_ALL=C "$1" ${2:+"$2"} --help 2>/dev/null)
    fi
    printf '%s\n' "${_leash_help_cache[$key]}"
}

# _leash_commands BINARY: the command names of `leash --help`.
_leash_commands()
{
    _leash_help "$1" | awk '!done && /^commands:/ { on = 1; next } on && /^$/ { on = 0; done = 1 }
                            on && /^  [a-z]/ { print $1 }'
}

# _leash_options BINARY [COMMAND]: every option, "--name" for one with a value and
# "--name!" for a switch; --help and --version are not in the table's list, so added here.
_leash_options()
{
    _leash_help "$1" "${2-}" | awk '/^environment:/ { on = 1; next }
        on && /^  LEASH_[A-Z0-9_]+ +--[a-z0-9-]+/ { print $2 ($3 == "(switch)" ? "!" : "") }'
    printf '%s\n' --help! --version!
}

# _leash_metavar BINARY COMMAND OPTION: the word after OPTION on its help line ("DIR").
_leash_metavar()
{
    _leash_help "$1" "$2" | awk -v o="$3" '!done && $1 == o && NF > 1 { print $2; done = 1 }'
}

_leash()
{
    local cur prev words cword split=false
    if declare -F _init_completion >/dev/null 2>&1; then
        _init_completion -s || return
    else
        # Without bash-completion: the raw words, and --opt=value split by hand.
        words=("${COMP_WORDS[@]}")
        cword=$COMP_CWORD
        cur=${COMP_WORDS[COMP_CWORD]}
        prev=${COMP_WORDS[COMP_CWORD - 1]}
        if [[ $cur == --*=* ]]; then
            prev=${cur%%=*}
            cur=${cur#*=}
            split=true
        elif [[ $cur == = && $prev == --* ]]; then
            cur=
            split=true
        elif [[ $prev == = && $cword -ge 2 ]]; then
            prev=${COMP_WORDS[COMP_CWORD - 2]}
            split=true
        fi
    fi
    local bin=${words[0]/#\~/$HOME} i w cmd='' cmdat=0 opts globals

    # The command: the first word that is neither an option nor a global option's value.
    globals=$(_leash_options "$bin")
    for ((i = 1; i < cword; i++)); do
        w=${words[i]}
        if [[ $w == -* ]]; then
            grep -qxF -- "$w" <<<"$globals" && ((i += 1))
        else
            cmd=$w cmdat=$i
            break
        fi
    done

    opts=$(_leash_options "$bin" "$cmd")
    # The word before is an option that takes a value (not a switch): complete the value.
    if [[ $prev == --* ]] && grep -qxF -- "$prev" <<<"$opts"; then
        case $prev in
            --log-format) _leash_reply -W 'text json' -- "$cur" ;;
            --log-level) _leash_reply -W 'debug info warn error' -- "$cur" ;;
            --status) _leash_reply -W 'done dead done,dead' -- "$cur" ;;
            *)
                case $(_leash_metavar "$bin" "$cmd" "$prev") in
                    DIR) _leash_files; _leash_reply -d -- "$cur" ;;
                    F | FILE | F.jsonl | *.jsonl) _leash_files; _leash_reply -f -- "$cur" ;;
                    *) COMPREPLY=() ;;
                esac
                ;;
        esac
        return
    fi
    $split && return

    if [[ $cur == -* ]]; then
        _leash_reply -W "${opts//!/}" -- "$cur"
        return
    fi
    if [[ -z $cmd ]]; then
        _leash_reply -W "$(_leash_commands "$bin")" -- "$cur"
        return
    fi
    # Arguments of the command, counted after it (options and their values skipped).
    local nargs=0
    for ((i = cmdat + 1; i < cword; i++)); do
        w=${words[i]}
        if [[ $w == -- ]]; then
            ((nargs += cword - i - 1))
            break
        elif [[ $w == --*=* ]]; then
            :
        elif [[ $w == -* ]]; then
            grep -qxF -- "$w" <<<"$opts" && ((i += 1))
        else
            ((nargs += 1))
        fi
    done
    case $cmd in
        run | check)
            if ((nargs == 0)); then
                _leash_files
                mapfile -t COMPREPLY < <(compgen -f -X '!*.lua' -- "$cur"; compgen -d -- "$cur")
            fi
            ;;
        tenant)
            ((nargs == 0)) && _leash_reply -W 'set list reset' -- "$cur"
            ;;
        *) COMPREPLY=() ;;
    esac
} && complete -F _leash leash
