/*
 * pgvalue: one PostgreSQL column value, as libpq returns it in text format, turned into
 * the Lua value a script expects: NULL is the null sentinel (as JSON null is), booleans,
 * integers and floats become Lua booleans and numbers, json/jsonb arrive decoded through
 * json_lua, and every other type stays the server's text. Takes plain arguments (type OID,
 * text, length, null flag) so it needs no libpq headers and can be tested without a server.
 */
#ifndef LEASH_PGVALUE_H
#define LEASH_PGVALUE_H

#include <lua.h>

/* [-0, +1, m] Push the value of one text-format cell. text is borrowed (PQgetvalue's
   pointer, valid until PQclear): len bytes, any content, read during the call only.
   bool (16) "t"/"f" -> boolean; int2/int4/int8/oid (21, 23, 20, 26) -> integer;
   float4/float8 (700, 701) -> float, "NaN" and "Infinity"/"-Infinity" included;
   numeric (1700) -> integer when the text is an integer within int64, else float
   (NaN and the infinities too); json/jsonb (114, 3802) -> decoded value, or the text
   itself if it will not decode (deeper than JSONLUA_MAX_DEPTH, say);
   anything else, and any text the cases above cannot read -> string. */
void pgvalue_push(lua_State *L, unsigned int type_oid, const char *text, int len, int isnull);

#endif
