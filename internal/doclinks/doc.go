// Package doclinks holds the test that keeps the documentation's links
// whole: every relative link in README.md and docs/ names a file that
// exists, and every #anchor a heading of that file.
package doclinks
