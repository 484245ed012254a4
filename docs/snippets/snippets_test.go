package snippets

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestCodeBlocksCompile: every Go code block of the README and of docs/
// compiles (go vet, with -race as make test's vet, so that its builds are
// reused). Each block becomes the body of a function that returns an
// error, beside the names the blocks take as given (preamble); the
// variables a block declares are then used, and the packages it names
// imported, so that a block need not be a whole program. A block that is
// one (package main) is built as written, a program of its own.
func TestCodeBlocksCompile(t *testing.T) {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	pages, err := filepath.Glob(filepath.Join(dir, "..", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join(dir, "..", "..", "README.md"))
	overlay := map[string]string{}
	write := func(name, source string) {
		path := filepath.Join(t.TempDir(), name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(source), 0o644); err != nil {
			t.Fatal(err)
		}
		overlay[filepath.Join(dir, name)] = path
	}
	write("zz_preamble.go", preamble)
	blocks := 0
	var programs []string // the blocks that are whole programs, each a directory of its own
	for _, page := range pages {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for i, block := range goBlocks(string(text)) {
			if strings.HasPrefix(block, "package main\n") {
				program := fmt.Sprintf("zz_%s_%d", strings.ReplaceAll(strings.TrimSuffix(filepath.Base(page), ".md"), "-", "_"), i)
				write(filepath.Join(program, "main.go"), block)
				programs = append(programs, "./"+program)
				continue
			}
			name := fmt.Sprintf("zz_%s_%d.go", strings.ReplaceAll(strings.TrimSuffix(filepath.Base(page), ".md"), "-", "_"), i)
			source, err := wrap(block, fmt.Sprintf("%s block %d", filepath.Base(page), i))
			if err != nil {
				t.Errorf("%s, block %d: %v\n%s", page, i, err, block)
				continue
			}
			write(name, source)
			blocks++
		}
	}
	if blocks < 10 {
		t.Fatalf("found %d Go blocks in %d pages, want the README's and the docs' (10 at least)", blocks, len(pages))
	}
	spec, err := json.Marshal(map[string]any{"Replace": overlay})
	if err != nil {
		t.Fatal(err)
	}
	specFile := filepath.Join(t.TempDir(), "overlay.json")
	if err := os.WriteFile(specFile, spec, 0o644); err != nil {
		t.Fatal(err)
	}
	list := exec.Command("go", "list", "-overlay="+specFile, "-f", "{{len .GoFiles}}", ".")
	list.Dir = dir
	if out, err := list.Output(); err != nil || strings.TrimSpace(string(out)) != fmt.Sprint(blocks+2) {
		t.Fatalf("go list of the package with the blocks: %s, %v; want %d files (the blocks, the preamble, deps.go)", out, err, blocks+2)
	}
	vet := exec.Command("go", "vet", "-race", "-overlay="+specFile, ".")
	vet.Dir = dir
	if out, err := vet.CombinedOutput(); err != nil {
		t.Fatalf("the code blocks do not compile: %v\n%s", err, out)
	}
	if len(programs) < 2 {
		t.Fatalf("found %d whole programs in the docs, want the first programs' 2 at least", len(programs))
	}
	build := exec.Command("go", append([]string{"build", "-race", "-o", os.DevNull, "-overlay=" + specFile}, programs...)...)
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("the whole programs of the docs do not build: %v\n%s", err, out)
	}
	t.Logf("%d Go blocks of %d pages compile", blocks, len(pages))
}

// goBlockPattern matches a fenced block of Go.
var goBlockPattern = regexp.MustCompile("(?s)```go\n(.*?)```")

// goBlocks returns the Go code blocks of a Markdown page.
func goBlocks(page string) []string {
	var blocks []string
	for _, m := range goBlockPattern.FindAllStringSubmatch(page, -1) {
		blocks = append(blocks, m[1])
	}
	return blocks
}

// wrap returns a file of package snippets whose function runs block: its
// import lines become the file's, the packages it names beside them are
// imported, and each variable it declares at its top level is used.
func wrap(block, name string) (string, error) {
	var imports, body []string
	for line := range strings.Lines(block) {
		if path, ok := strings.CutPrefix(strings.TrimSpace(line), "import "); ok {
			imports = append(imports, path)
		} else {
			body = append(body, line)
		}
	}
	code := strings.Join(body, "")
	fn := "package snippets\n\n// " + name + "\nfunc _() error {\n" + code + "\nreturn nil\n}\n"
	file, err := parser.ParseFile(token.NewFileSet(), name, fn, 0)
	if err != nil {
		return "", err
	}
	var uses []string
	for _, stmt := range file.Decls[0].(*ast.FuncDecl).Body.List {
		uses = append(uses, declared(stmt)...)
	}
	ast.Inspect(file, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && packages[id.Name] != "" && !slices.Contains(imports, packages[id.Name]) {
				imports = append(imports, packages[id.Name])
			}
		}
		return true
	})
	var using strings.Builder
	for _, u := range uses {
		using.WriteString("_ = " + u + "\n")
	}
	return "package snippets\n\nimport (\n" + strings.Join(imports, "\n") + "\n)\n\n// " + name + "\nfunc _() error {\n" + code + "\n" + using.String() + "return nil\n}\n", nil
}

// declared returns the names a statement at a function's top level
// declares, but _.
func declared(stmt ast.Stmt) []string {
	var names []string
	add := func(id *ast.Ident) {
		if id.Name != "_" && !slices.Contains(names, id.Name) {
			names = append(names, id.Name)
		}
	}
	switch s := stmt.(type) {
	case *ast.AssignStmt:
		if s.Tok == token.DEFINE {
			for _, e := range s.Lhs {
				if id, ok := e.(*ast.Ident); ok {
					add(id)
				}
			}
		}
	case *ast.DeclStmt:
		for _, spec := range s.Decl.(*ast.GenDecl).Specs {
			if v, ok := spec.(*ast.ValueSpec); ok {
				for _, id := range v.Names {
					add(id)
				}
			}
		}
	}
	return names
}

// packages are the packages a block may name, by the name it calls them.
var packages = map[string]string{
	"pace":          `"github.com/fleetpace/pace"`,
	"paceotel":      `"github.com/fleetpace/pace/extra/paceotel"`,
	"headers":       `"github.com/fleetpace/pace/headers"`,
	"redis":         `"github.com/redis/go-redis/v9"`,
	"logging":       `"github.com/redis/go-redis/v9/logging"`,
	"retryablehttp": `"github.com/hashicorp/go-retryablehttp"`,
	"http":          `"net/http"`,
	"time":          `"time"`,
	"context":       `"context"`,
	"log":           `"log"`,
	"slog":          `"log/slog"`,
	"fmt":           `"fmt"`,
	"errors":        `"errors"`,
	"os":            `"os"`,
	"io":            `"io"`,
}

// preamble declares what the blocks take as given: a Redis client (rdb,
// or client), a request's context, a quota and a limiter, a response, a
// request body, the items of a batch and the functions that are the
// reader's own.
const preamble = `package snippets

import (
	"context"
	"io"
	"net/http"

	"github.com/fleetpace/pace"
	"github.com/redis/go-redis/v9"
)

var (
	rdb, client *redis.Client
	ctx         context.Context
	quota       pace.Quota
	limiter     *pace.Redis
	resp        *http.Response
	body        io.Reader
	items       []string
)

func process(string) {}
`
