package busmq

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The README's example, run as written against a live gateway (only its address differs:
// the test's gateway listens on a free port, not 8443).
func TestTheReadmeExampleRunsAsWritten(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	match := regexp.MustCompile("(?s)```go\n(.*?)```").FindSubmatch(readme)
	if match == nil || !strings.Contains(string(match[1]), "127.0.0.1:8443") {
		t.Fatal("the README has no Go example naming 127.0.0.1:8443")
	}
	d := start(t)
	dir := t.TempDir()
	program := strings.Replace(string(match[1]), "127.0.0.1:8443", d.address(), 1)
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(program), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".busmq-secret"), []byte(d.secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run := exec.Command("go", "run", "main.go")
	run.Dir = dir
	out, err := run.CombinedOutput()
	if err != nil || string(out) != "1 one\n2 two\n" {
		t.Fatalf("go run: %v\n%s", err, out)
	}
}
