/*
 * ncat_reader_guard: what no privilege takes from the analysts' role.
 *
 * PostgreSQL has no privilege for LISTEN and NOTIFY, lets every session raise its own
 * work_mem (and the other settings that size a statement's memory), and lets an ordinary
 * role change its own password and session defaults.  The catalog's readers share one
 * role (catalog_reader) and use it from psql, so one analyst could lock the others out
 * (ALTER ROLE ... PASSWORD), raise everyone's defaults (ALTER ROLE ... SET), or grow a
 * backend to gigabytes (SET work_mem = '10GB').
 *
 * Loaded into the reader's sessions only (migration 0033 sets the role's
 * session_preload_libraries, a superuser-only setting, when the server has this library),
 * it refuses, for a session whose user is not a superuser:
 *   - LISTEN, UNLISTEN and NOTIFY;
 *   - ALTER ROLE (password, attributes) and ALTER ROLE ... SET;
 *   - a value above its cap for work_mem, maintenance_work_mem, hash_mem_multiplier and
 *     max_parallel_workers_per_gather, however it is set: SET, set_config(), a function's
 *     SET clause; a connection whose startup options ask for more is closed with the cap
 *     named.
 *   - turning off, or raising above its cap, idle_session_timeout,
 *     idle_in_transaction_session_timeout and transaction_timeout (the role's defaults of
 *     migration 0038: 10 min, 1 min, 5 min), however it is set; a connection whose
 *     startup options do is closed with the cap named. Without this a session could turn
 *     its own off and hold one of the role's slots for ever where no worker's reconciler
 *     runs (statement_timeout is left to the session: the console sets its own per
 *     statement, and the console's watchdog and the reconciler cancel overdue ones);
 * and bounds the memory of the session's process: the address space it may add to what
 * it held at login (ncat_reader_guard.max_backend_memory, default 1 GB; Linux, through
 * RLIMIT_AS). Memory that no setting sizes (values: array_fill(0::int8, array[120000000])
 * twice in one row held 2.7 GB) then fails the statement with "out of memory", and the
 * session, the server and every other session go on.
 * A reader's login to a database that is not a catalog is refused: `ncat migrate` marks
 * each catalog (ALTER ROLE catalog_reader IN DATABASE ... SET
 * ncat_reader_guard.catalog_database = on); elsewhere (postgres, template1, another
 * application's database) a reader read other sessions' query text and cancelled them.
 * The caps are settings of their own (ncat_reader_guard.max_work_mem, ...), which only a
 * superuser can change.
 */
#include "postgres.h"

#include <limits.h>
#include <stdio.h>
#ifdef __linux__
#include <sys/resource.h>
#include <unistd.h>
#endif

#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "tcop/utility.h"
#include "utils/guc.h"
#include "utils/guc_tables.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

static ProcessUtility_hook_type prev_utility = NULL;

static int	cap_work_mem = 65536;	/* kB */
static int	cap_maintenance_work_mem = 65536;	/* kB */
static double cap_hash_mem_multiplier = 2.0;
static int	cap_parallel_workers = 2;
static int	cap_backend_memory = 1048576;	/* kB beyond the process's size at login */
static bool catalog_database = false;	/* set per catalog database by ncat migrate */

/* The time settings a reader session may lower but not turn off (0) or raise: the
 * server's setting, the guard's cap (ms; 0: not capped) and the check hook it had. */
typedef struct TimeoutCap
{
	const char *name;
	const char *cap_name;
	const char *description;
	int			cap;
	GucIntCheckHook prev;
} TimeoutCap;

static TimeoutCap timeouts[] = {
	{"idle_session_timeout", "ncat_reader_guard.max_idle_session_timeout",
	 "The longest idle_session_timeout a reader session may ask for (0: no cap).",
	 600000, NULL},
	{"idle_in_transaction_session_timeout",
	 "ncat_reader_guard.max_idle_in_transaction_session_timeout",
	 "The longest idle_in_transaction_session_timeout a reader session may ask for "
	 "(0: no cap).", 60000, NULL},
	{"transaction_timeout", "ncat_reader_guard.max_transaction_timeout",
	 "The longest transaction_timeout a reader session may ask for (0: no cap; "
	 "PostgreSQL 17+).", 300000, NULL},
};

static GucIntCheckHook prev_work_mem_check = NULL;
static GucIntCheckHook prev_maintenance_check = NULL;
static GucRealCheckHook prev_hash_mem_check = NULL;
static GucIntCheckHook prev_parallel_check = NULL;

/* Values from the server's own files, the role's and database's settings and the
 * defaults are an administrator's: only what a session asks for itself is capped. */
static bool
asked_by_session(GucSource source)
{
	return source == PGC_S_CLIENT || source == PGC_S_SESSION ||
		source == PGC_S_INTERACTIVE || source == PGC_S_TEST;
}

static bool
int_within(int newval, int cap, const char *name, const char *unit, GucSource source)
{
	if (!asked_by_session(source) || newval <= cap)
		return true;
	GUC_check_errcode(ERRCODE_INSUFFICIENT_PRIVILEGE);
	GUC_check_errmsg("%s is capped at %d%s for the catalog's readers (asked %d%s)",
					 name, cap, unit, newval, unit);
	GUC_check_errhint("A superuser sets the cap with ncat_reader_guard.%s%s.",
					  strncmp(name, "max_", 4) == 0 ? "" : "max_", name);
	return false;
}

static bool
check_work_mem_cap(int *newval, void **extra, GucSource source)
{
	if (!int_within(*newval, cap_work_mem, "work_mem", "kB", source))
		return false;
	return prev_work_mem_check == NULL || prev_work_mem_check(newval, extra, source);
}

static bool
check_maintenance_cap(int *newval, void **extra, GucSource source)
{
	if (!int_within(*newval, cap_maintenance_work_mem, "maintenance_work_mem", "kB", source))
		return false;
	return prev_maintenance_check == NULL || prev_maintenance_check(newval, extra, source);
}

static bool
check_parallel_cap(int *newval, void **extra, GucSource source)
{
	if (!int_within(*newval, cap_parallel_workers, "max_parallel_workers_per_gather", "",
					source))
		return false;
	return prev_parallel_check == NULL || prev_parallel_check(newval, extra, source);
}

/* A session's value of timeouts[i]: at most its cap, and never 0 (off) while capped. */
static bool
timeout_within(int i, int newval, GucSource source)
{
	const TimeoutCap *t = &timeouts[i];

	if (!asked_by_session(source) || t->cap == 0 || (newval > 0 && newval <= t->cap))
		return true;
	GUC_check_errcode(ERRCODE_INSUFFICIENT_PRIVILEGE);
	if (newval == 0)
		GUC_check_errmsg("%s cannot be turned off by the catalog's readers (at most %d ms)",
						 t->name, t->cap);
	else
		GUC_check_errmsg("%s is capped at %d ms for the catalog's readers (asked %d ms)",
						 t->name, t->cap, newval);
	GUC_check_errhint("A superuser sets the cap with %s.", t->cap_name);
	return false;
}

static bool
check_timeout(int i, int *newval, void **extra, GucSource source)
{
	if (!timeout_within(i, *newval, source))
		return false;
	return timeouts[i].prev == NULL || timeouts[i].prev(newval, extra, source);
}

static bool
check_timeout_0(int *newval, void **extra, GucSource source)
{
	return check_timeout(0, newval, extra, source);
}

static bool
check_timeout_1(int *newval, void **extra, GucSource source)
{
	return check_timeout(1, newval, extra, source);
}

static bool
check_timeout_2(int *newval, void **extra, GucSource source)
{
	return check_timeout(2, newval, extra, source);
}

static const GucIntCheckHook timeout_checks[] = {check_timeout_0, check_timeout_1,
check_timeout_2};

static bool
check_hash_mem_cap(double *newval, void **extra, GucSource source)
{
	if (asked_by_session(source) && *newval > cap_hash_mem_multiplier)
	{
		GUC_check_errcode(ERRCODE_INSUFFICIENT_PRIVILEGE);
		GUC_check_errmsg("hash_mem_multiplier is capped at %g for the catalog's readers "
						 "(asked %g)", cap_hash_mem_multiplier, *newval);
		GUC_check_errhint("A superuser sets the cap with "
						  "ncat_reader_guard.max_hash_mem_multiplier.");
		return false;
	}
	return prev_hash_mem_check == NULL || prev_hash_mem_check(newval, extra, source);
}

static struct config_generic *
guc_record(const char *name)
{
#if PG_VERSION_NUM >= 160000
	return find_option(name, false, true, ERROR);
#else
	struct config_generic **vars = get_guc_variables();
	int			n = GetNumConfigOptions();

	for (int i = 0; i < n; i++)
		if (vars[i] != NULL && pg_strcasecmp(vars[i]->name, name) == 0)
			return vars[i];
	return NULL;
#endif
}

static struct config_int *
int_record(const char *name)
{
	struct config_generic *g = guc_record(name);

	if (g == NULL || g->vartype != PGC_INT)
		elog(ERROR, "ncat_reader_guard: no integer setting %s on this server", name);
	return (struct config_int *) g;
}

/* A value the connection's startup options put in force above its cap. */
static void
refuse_startup_value(struct config_generic *rec, double value, double cap, const char *unit)
{
	if (asked_by_session(rec->source) && value > cap)
		ereport(FATAL,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("%s is capped at %.15g%s for the catalog's readers; this connection "
						"asked for %.15g%s", rec->name, cap, unit, value, unit),
				 errhint("Connect without that option (PGOPTIONS, options=).")));
}

/* Each capped timeout the server has: its startup value checked, its check hook held. */
static void
guard_timeouts(void)
{
	for (int i = 0; i < (int) lengthof(timeouts); i++)
	{
		TimeoutCap *t = &timeouts[i];
		struct config_generic *g = guc_record(t->name);
		struct config_int *rec;

		if (g == NULL || g->vartype != PGC_INT)
			continue;			/* an older server (transaction_timeout: 17+) */
		rec = (struct config_int *) g;
		if (asked_by_session(g->source) && t->cap != 0 &&
			(*rec->variable == 0 || *rec->variable > t->cap))
			ereport(FATAL,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("%s is capped at %d ms for the catalog's readers and cannot be "
							"turned off; this connection asked for %d ms", t->name, t->cap,
							*rec->variable),
					 errhint("Connect without that option (PGOPTIONS, options=).")));
		t->prev = rec->check_hook;
		rec->check_hook = timeout_checks[i];
	}
}

static void
guard_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
			  ProcessUtilityContext context, ParamListInfo params,
			  QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *stmt = pstmt->utilityStmt;
	const char *what = NULL;
	bool		role = false;

	switch (nodeTag(stmt))
	{
		case T_ListenStmt:
			what = "LISTEN";
			break;
		case T_UnlistenStmt:
			what = "UNLISTEN";
			break;
		case T_NotifyStmt:
			what = "NOTIFY";
			break;
		case T_AlterRoleStmt:
			what = "ALTER ROLE";
			role = true;
			break;
		case T_AlterRoleSetStmt:
			what = "ALTER ROLE ... SET";
			role = true;
			break;
		default:
			break;
	}
	if (what != NULL && !superuser())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("%s is not allowed for the catalog's readers", what),
				 role ? errdetail("Analysts share this role: its password and session "
								  "defaults are the catalog administrator's.")
				 : errdetail("Nothing of the catalog listens, and a reader's "
							 "notifications would only fill the server's queue.")));
	if (prev_utility)
		prev_utility(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params,
								queryEnv, dest, qc);
}

/* The process may grow by cap_backend_memory kB beyond its address space now (shared
 * memory and the libraries included): a soft RLIMIT_AS, which the process cannot raise
 * from SQL. malloc then fails, and palloc turns that into ERROR "out of memory". */
static void
bound_backend_memory(void)
{
#ifdef __linux__
	FILE	   *statm = fopen("/proc/self/statm", "r");
	unsigned long pages = 0;
	struct rlimit lim;
	rlim_t		want;

	if (statm == NULL)
		return;
	if (fscanf(statm, "%lu", &pages) != 1)
		pages = 0;
	fclose(statm);
	if (pages == 0 || getrlimit(RLIMIT_AS, &lim) != 0)
		return;
	want = (rlim_t) pages * (rlim_t) sysconf(_SC_PAGESIZE) +
		(rlim_t) cap_backend_memory * 1024;
	if (lim.rlim_max != RLIM_INFINITY && want > lim.rlim_max)
		want = lim.rlim_max;
	if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur <= want)
		return;					/* already tighter */
	lim.rlim_cur = want;
	if (setrlimit(RLIMIT_AS, &lim) != 0)
		elog(WARNING, "ncat_reader_guard: could not bound this session's memory");
#endif
}

void
_PG_init(void)
{
	struct config_int *work_mem_rec;
	struct config_int *maintenance_rec;
	struct config_int *parallel_rec;
	struct config_generic *hash_gen;
	struct config_real *hash_rec;

	DefineCustomIntVariable("ncat_reader_guard.max_work_mem",
							"The most work_mem a reader session may ask for.",
							NULL, &cap_work_mem, 65536, 64, MAX_KILOBYTES,
							PGC_SUSET, GUC_UNIT_KB, NULL, NULL, NULL);
	DefineCustomIntVariable("ncat_reader_guard.max_maintenance_work_mem",
							"The most maintenance_work_mem a reader session may ask for.",
							NULL, &cap_maintenance_work_mem, 65536, 1024, MAX_KILOBYTES,
							PGC_SUSET, GUC_UNIT_KB, NULL, NULL, NULL);
	DefineCustomRealVariable("ncat_reader_guard.max_hash_mem_multiplier",
							 "The largest hash_mem_multiplier a reader session may ask for.",
							 NULL, &cap_hash_mem_multiplier, 2.0, 1.0, 1000.0,
							 PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("ncat_reader_guard.max_parallel_workers_per_gather",
							"The most parallel workers per Gather a reader session may ask for.",
							NULL, &cap_parallel_workers, 2, 0, 1024,
							PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("ncat_reader_guard.max_backend_memory",
							"The memory a reader session's process may add to its size at "
							"login (Linux).",
							NULL, &cap_backend_memory, 1048576, 65536, MAX_KILOBYTES,
							PGC_SUSET, GUC_UNIT_KB, NULL, NULL, NULL);
	for (int i = 0; i < (int) lengthof(timeouts); i++)
		DefineCustomIntVariable(timeouts[i].cap_name, timeouts[i].description, NULL,
								&timeouts[i].cap, timeouts[i].cap, 0, INT_MAX,
								PGC_SUSET, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomBoolVariable("ncat_reader_guard.catalog_database",
							 "Whether this database is a catalog the readers may log in to "
							 "(set per database by ncat migrate).",
							 NULL, &catalog_database, false,
							 PGC_SUSET, 0, NULL, NULL, NULL);
#if PG_VERSION_NUM >= 150000
	MarkGUCPrefixReserved("ncat_reader_guard");
#else
	EmitWarningsOnPlaceholders("ncat_reader_guard");
#endif

	/* A superuser (LOAD for a test, or a role setting on an administrator) is not held. */
	if (superuser_arg(GetSessionUserId()))
		return;

	/* A client's login only: a parallel worker gets its leader's settings after this. */
	if (MyBackendType == B_BACKEND && !catalog_database)
		ereport(FATAL,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("the catalog's readers log in to catalog databases only; this "
						"database (oid %u) is not one", MyDatabaseId),
				 errhint("`ncat migrate` marks a catalog's database (a catalog migrated by "
						 "an older version needs it once).")));

	work_mem_rec = int_record("work_mem");
	maintenance_rec = int_record("maintenance_work_mem");
	parallel_rec = int_record("max_parallel_workers_per_gather");
	hash_gen = guc_record("hash_mem_multiplier");
	if (hash_gen == NULL || hash_gen->vartype != PGC_REAL)
		elog(ERROR, "ncat_reader_guard: no setting hash_mem_multiplier on this server");
	hash_rec = (struct config_real *) hash_gen;

	refuse_startup_value(&work_mem_rec->gen, *work_mem_rec->variable, cap_work_mem, "kB");
	refuse_startup_value(&maintenance_rec->gen, *maintenance_rec->variable,
						 cap_maintenance_work_mem, "kB");
	refuse_startup_value(&parallel_rec->gen, *parallel_rec->variable, cap_parallel_workers,
						 "");
	refuse_startup_value(hash_gen, *hash_rec->variable, cap_hash_mem_multiplier, "");

	prev_work_mem_check = work_mem_rec->check_hook;
	work_mem_rec->check_hook = check_work_mem_cap;
	prev_maintenance_check = maintenance_rec->check_hook;
	maintenance_rec->check_hook = check_maintenance_cap;
	prev_parallel_check = parallel_rec->check_hook;
	parallel_rec->check_hook = check_parallel_cap;
	prev_hash_mem_check = hash_rec->check_hook;
	hash_rec->check_hook = check_hash_mem_cap;
	guard_timeouts();

	prev_utility = ProcessUtility_hook;
	ProcessUtility_hook = guard_utility;

	bound_backend_memory();
}
