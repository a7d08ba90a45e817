#compdef kubectl-fence
# Completion of kubectl-fence typed as one word, for zsh: source <(kubectl-fence completion zsh)
# (`kubectl fence <TAB>` needs no script: kubectl runs kubectl_complete-fence.)
_kubectl_fence() {
  local -a lines candidates
  lines=("${(@f)$(${words[1]} __complete "${(@)words[2,CURRENT]}" 2>/dev/null)}")
  local directive=${lines[-1]#:}
  candidates=("${(@)lines[1,-2]}")
  if (( ${#candidates} )); then
    compadd -- "${candidates[@]}"
  elif [[ $directive == 0 ]]; then
    _files
  fi
}
compdef _kubectl_fence kubectl-fence
