/* The limits file: what the agent writes parses; what it must not be is
 * refused with a reason, and the library then fails closed (no memory),
 * never open. No variable the tenant sets changes that.
 *
 *   limits parse       the parser's table
 *   limits <case>      one fail-closed case, with the directory prepared by run.sh
 */
#include "check.h"

struct tessera_limits;
typedef int (*parse_fn)(const char *, void *, char *, size_t);

static void parse_table(void)
{
	parse_fn parse = (parse_fn)dlsym(RTLD_DEFAULT, "tessera_parse_limits");
	CHECK(parse != NULL, "tessera_parse_limits not found");
	if (!parse)
		return;
	static char out[8192];
	struct {
		const char *name, *text, *why; /* why: NULL when it parses */
	} cases[] = {
		{"one GPU", GPU0 " 1073741824 30\n", NULL},
		{"two GPUs, comments, blank lines", "# written by tessera-agent\n\n" GPU0 " 1 1\n  " GPU1 "\t2 100", NULL},
		{"empty", "", "no GPU listed"},
		{"only comments", "# nothing\n", "no GPU listed"},
		{"not a UUID", "0 1073741824 30\n", "is not a GPU UUID"},
		{"missing cores", GPU0 " 1073741824\n", "want \"<GPU UUID>"},
		{"an MPS client", GPU0 " 1 30 mps\n", NULL},
		{"unknown mode", GPU0 " 1 30 x\n", "want \"<GPU UUID>"},
		{"extra field", GPU0 " 1 30 mps x\n", "want \"<GPU UUID>"},
		{"zero memory", GPU0 " 0 30\n", "memory must be > 0"},
		{"negative memory", GPU0 " -5 30\n", "memory must be > 0"},
		{"cores 0", GPU0 " 1 0\n", "cores 1-100"},
		{"cores 101", GPU0 " 1 101\n", "cores 1-100"},
		{"twice", GPU0 " 1 1\n" GPU0 " 1 1\n", "listed twice"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char why[200] = "";
		int r = parse(cases[i].text, out, why, sizeof(why));
		if (!cases[i].why)
			CHECK(r == 0, "%s: refused: %s", cases[i].name, why);
		else
			CHECK(r != 0 && strstr(why, cases[i].why), "%s: got %d %s, want a refusal saying %s", cases[i].name, r, why, cases[i].why);
	}
}

/* refused: memory is refused, reported as none, and the reason said. */
static void refused(void)
{
	on_device(0);
	CUdeviceptr p;
	CHECK(cuMemAlloc_v2(&p, 1) == CUDA_ERROR_OUT_OF_MEMORY, "an allocation was allowed without valid limits");
	size_t f = 1, t = 1;
	CU(cuMemGetInfo_v2(&f, &t));
	CHECK(f == 0 && t == 0, "cuMemGetInfo reported %zu of %zu without valid limits", f, t);
	CUmodule m;
	CUfunction fn;
	CU(cuModuleLoadData(&m, "fake"));
	CU(cuModuleGetFunction(&fn, m, "k10"));
	CHECK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) == CUDA_ERROR_NOT_PERMITTED, "a launch was allowed without valid limits");
}

int main(int argc, char **argv)
{
	const char *c = argc > 1 ? argv[1] : "parse";
	if (strcmp(c, "parse") == 0) {
		parse_table();
		return done("limits: the parser's table");
	}
	if (strcmp(c, "missing") == 0 || strcmp(c, "bad") == 0) {
		refused();
		return done(strcmp(c, "missing") == 0 ? "limits: no limits file: fails closed" : "limits: a bad limits file: fails closed");
	}
	if (strcmp(c, "unlisted") == 0) {
		/* GPU 1 has no grant: refused there, allowed on GPU 0. */
		write_limits(NULL, GPU0 " 1048576 50\n");
		CUcontext ctx;
		CU(cuInit(0));
		CU(cuCtxCreate_v2(&ctx, 0, 1));
		CUdeviceptr p;
		CHECK(cuMemAlloc_v2(&p, 1) == CUDA_ERROR_OUT_OF_MEMORY, "an allocation on a GPU with no grant was allowed");
		CU(cuCtxCreate_v2(&ctx, 0, 0));
		CU(cuMemAlloc_v2(&p, 1));
		return done("limits: a GPU not in the limits gets nothing");
	}
	if (strcmp(c, "no-opt-out") == 0) {
		/* Run with the variables other limiters honour set: the grant
		 * still holds. */
		write_limits(NULL, GPU0 " 1048576 50\n");
		on_device(0);
		CUdeviceptr p;
		CHECK(cuMemAlloc_v2(&p, 2 * MiB) == CUDA_ERROR_OUT_OF_MEMORY, "the grant did not hold with %s set", getenv("CUDA_DISABLE_CONTROL") ? "CUDA_DISABLE_CONTROL" : "the variables");
		return done("limits: CUDA_DISABLE_CONTROL, TESSERA_* and an emptied LD_PRELOAD change nothing");
	}
	if (strcmp(c, "report") == 0) {
		/* What the library makes of the limits file it is given (the
		 * agent's contract test): GPU 0's total, and an allocation that
		 * fits (the file was not refused). */
		on_device(0);
		size_t f, t;
		CU(cuMemGetInfo_v2(&f, &t));
		CUdeviceptr p;
		CU(cuMemAlloc_v2(&p, 1 << 20));
		printf("total %zu\n", t);
		return failures ? 1 : 0;
	}
	fprintf(stderr, "limits: unknown case %s\n", c);
	return 2;
}
