package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
)

// event is one history entry's fields: "ev" names it, in kebab-case, with its fields as the
// suite's history.rs spells them.
type event map[string]any

// recorder appends entries to the process's history file, one write per line, unbuffered,
// so that a process killed with SIGKILL loses nothing it recorded.
type recorder struct {
	process string
	mu      sync.Mutex
	file    *os.File
}

func newRecorder(path, process string) (*recorder, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open history: %w", err)
	}
	return &recorder{process: process, file: f}, nil
}

func (r *recorder) record(ev event) { r.recordAt(monotonic(), ev) }

// recordAt records ev as happening at t (taken when it happened). A failed write (disk
// full) must not look like a clean history: it ends the process.
func (r *recorder) recordAt(t uint64, ev event) {
	entry := make(map[string]any, len(ev)+2)
	for k, v := range ev {
		entry[k] = v
	}
	entry["t"], entry["p"] = t, r.process
	line, err := json.Marshal(entry)
	if err != nil {
		panic(fmt.Sprintf("serialize event: %v", err))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.file.Write(append(line, '\n')); err != nil {
		panic(fmt.Sprintf("append to history: %v", err))
	}
}
