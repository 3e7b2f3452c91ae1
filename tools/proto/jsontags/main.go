// Command jsontags writes, for every Go type of the Kubernetes API packages that have a
// generated.proto, its struct fields' json and protobuf tags and the Go shape of each field.
//
// Why: the protobuf schema says nothing about Kubernetes' JSON. Whether a field is left out when
// empty (omitempty/omitzero), printed as null when unset (a nil pointer, slice or map without
// omitempty), flattened into its parent (an embedded ",inline" struct) or named differently from
// its proto field ("$ref", "x-kubernetes-...") lives only in the Go types. kproxy's codec reads
// this file next to the descriptor set so that its JSON is the apiserver's own.
//
// Usage: jsontags <module dir>... > kubernetes-json.json (stdlib only: go/parser, no compilation
// of the Kubernetes modules).
package main

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
)

// Field is one struct field.
type Field struct {
	Go        string `json:"go"`
	Type      string `json:"type"`
	JSON      string `json:"json"`
	OmitEmpty bool   `json:"omitempty,omitempty"`
	OmitZero  bool   `json:"omitzero,omitempty"`
	Embedded  bool   `json:"embedded,omitempty"`
	Proto     int    `json:"proto,omitempty"`
	Skip      bool   `json:"skip,omitempty"`
}

// Type is one named Go type: a struct (Fields) or another type (Underlying).
type Type struct {
	Fields     []Field `json:"fields,omitempty"`
	Underlying string  `json:"underlying,omitempty"`
}

// Package is one API package: its API group (the "+groupName=" of its doc.go) and types.
type Package struct {
	Group string          `json:"group"`
	Types map[string]Type `json:"types"`
}

// groupName reads the "// +groupName=" marker, else register.go's GroupName constant; core/v1
// has the legacy "" group.
func groupName(dir string) string {
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	for _, f := range files {
		if filepath.Base(f) != "register.go" {
			continue
		}
		data, _ := os.ReadFile(f)
		for _, line := range strings.Split(string(data), "\n") {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "const GroupName = "); ok {
				return strings.Trim(strings.TrimSpace(rest), "\"")
			}
		}
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "// +groupName="); ok {
				return strings.TrimSpace(rest)
			}
		}
	}
	return ""
}

func main() {
	out := map[string]Package{}
	for _, root := range os.Args[2:] {
		modPath := ""
		if i := strings.Index(filepath.Base(root), "@"); i >= 0 {
			modPath = filepath.Base(root)[:i]
		}
		_ = filepath.Walk(root, func(path string, info os.FileInfo, err error) error {
			if err != nil || info.IsDir() || info.Name() != "generated.proto" {
				return err
			}
			dir := filepath.Dir(path)
			rel, _ := filepath.Rel(root, dir)
			importPath := "k8s.io/" + modPath + "/" + filepath.ToSlash(rel)
			out[importPath] = Package{Group: groupName(dir), Types: parsePackage(dir, importPath)}
			return nil
		})
	}
	f, err := os.Create(os.Args[1])
	if err != nil {
		panic(err)
	}
	enc := json.NewEncoder(f)
	enc.SetIndent("", " ")
	if err := enc.Encode(out); err != nil {
		panic(err)
	}
}

func parsePackage(dir, importPath string) map[string]Type {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi os.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go") && !strings.HasPrefix(fi.Name(), "zz_generated")
	}, 0)
	if err != nil {
		panic(err)
	}
	types := map[string]Type{}
	local := map[string]bool{}
	var specs []*ast.TypeSpec
	imports := map[*ast.TypeSpec]map[string]string{}
	for _, pkg := range pkgs {
		if strings.HasSuffix(pkg.Name, "_test") {
			continue
		}
		for _, file := range pkg.Files {
			imps := map[string]string{}
			for _, imp := range file.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				name := filepath.Base(p)
				if imp.Name != nil {
					name = imp.Name.Name
				}
				imps[name] = p
			}
			for _, decl := range file.Decls {
				gd, ok := decl.(*ast.GenDecl)
				if !ok || gd.Tok != token.TYPE {
					continue
				}
				for _, s := range gd.Specs {
					ts := s.(*ast.TypeSpec)
					local[ts.Name.Name] = true
					specs = append(specs, ts)
					imports[ts] = imps
				}
			}
		}
	}
	sort.Slice(specs, func(i, j int) bool { return specs[i].Name.Name < specs[j].Name.Name })
	for _, ts := range specs {
		r := &renderer{importPath: importPath, imports: imports[ts], local: local}
		st, ok := ts.Type.(*ast.StructType)
		if !ok {
			types[ts.Name.Name] = Type{Underlying: r.render(ts.Type)}
			continue
		}
		var fields []Field
		for _, f := range st.Fields.List {
			tag := reflect.StructTag("")
			if f.Tag != nil {
				s, _ := strconv.Unquote(f.Tag.Value)
				tag = reflect.StructTag(s)
			}
			typ := r.render(f.Type)
			names := []string{}
			for _, n := range f.Names {
				names = append(names, n.Name)
			}
			embedded := len(names) == 0
			if embedded {
				names = []string{strings.TrimPrefix(typ[strings.LastIndex(typ, ".")+1:], "*")}
			}
			for _, name := range names {
				if !ast.IsExported(name) {
					continue
				}
				fd := Field{Go: name, Type: typ, JSON: name, Embedded: embedded}
				if jt, ok := tag.Lookup("json"); ok {
					parts := strings.Split(jt, ",")
					if parts[0] == "-" && len(parts) == 1 {
						fd.Skip = true
					} else if parts[0] != "" {
						fd.JSON = parts[0]
					} else if embedded {
						fd.JSON = ""
					}
					for _, o := range parts[1:] {
						fd.OmitEmpty = fd.OmitEmpty || o == "omitempty"
						fd.OmitZero = fd.OmitZero || o == "omitzero"
					}
				} else if embedded {
					fd.JSON = ""
				}
				if pt := tag.Get("protobuf"); pt != "" && pt != "-" {
					parts := strings.Split(pt, ",")
					if len(parts) > 1 {
						fd.Proto, _ = strconv.Atoi(parts[1])
					}
				}
				fields = append(fields, fd)
			}
		}
		types[ts.Name.Name] = Type{Fields: fields}
	}
	return types
}

type renderer struct {
	importPath string
	imports    map[string]string
	local      map[string]bool
}

// render writes a type expression with package-qualified names spelled by import path:
// "*k8s.io/apimachinery/pkg/apis/meta/v1.Time", "[]string", "map[string]k8s.io/api/core/v1.X".
func (r *renderer) render(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.Ident:
		if r.local[t.Name] {
			return r.importPath + "." + t.Name
		}
		return t.Name
	case *ast.StarExpr:
		return "*" + r.render(t.X)
	case *ast.ArrayType:
		if t.Len != nil {
			return "[N]" + r.render(t.Elt)
		}
		return "[]" + r.render(t.Elt)
	case *ast.MapType:
		return "map[" + r.render(t.Key) + "]" + r.render(t.Value)
	case *ast.SelectorExpr:
		pkg := t.X.(*ast.Ident).Name
		return r.imports[pkg] + "." + t.Sel.Name
	case *ast.InterfaceType:
		return "interface{}"
	default:
		return "?"
	}
}
