# Completion of kubectl-fence typed as one word, for bash: source <(kubectl-fence completion bash)
# (`kubectl fence <TAB>` needs no script: kubectl runs kubectl_complete-fence.)
_kubectl_fence() {
  local cur=${COMP_WORDS[COMP_CWORD]} out directive
  out=$("${COMP_WORDS[0]}" __complete "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null) || return
  directive=${out##*:}
  out=${out%:*}
  COMPREPLY=($(compgen -W "$out" -- "$cur"))
  if [ "$directive" = 0 ] && [ ${#COMPREPLY[@]} -eq 0 ]; then
    COMPREPLY=($(compgen -f -- "$cur"))
  fi
}
complete -F _kubectl_fence kubectl-fence
