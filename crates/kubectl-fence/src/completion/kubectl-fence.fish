# Completion of kubectl-fence typed as one word, for fish: kubectl-fence completion fish | source
# (`kubectl fence <TAB>` needs no script: kubectl runs kubectl_complete-fence.)
function __kubectl_fence_complete
    set -l args (commandline -opc) (commandline -ct)
    set -e args[1]
    kubectl-fence __complete $args 2>/dev/null | string match -v -r '^:'
end
complete -c kubectl-fence -f -a '(__kubectl_fence_complete)'
