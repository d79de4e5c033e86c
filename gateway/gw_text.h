/*  gw_text - an operation's answer in words, for MCP's text content.

    The words are schemas/operations.json's ("text" of each MCP operation, generated into
    sbx_ops[op].text): mustache-like templates over the answer's fields, checked by the
    generator against the output schema and the arguments. {x} a field, {x:fmt} a
    formatted one, {@a} an argument (its default when not given), {#x}...{/x} once per
    element of an array (or once when x is set), {?x}...{/x} once when x is set,
    {^x}...{/x} once when it is not (absent, null, false, "" or []). Formats: chomp (one
    trailing newline off), mib (bytes as 1.5), signal (SIGTERM, or "signal 70"),
    words.TABLE (sbx_ops_words_json; "*" the default, "@TABLE" another table's),
    plural.ONE.MANY ("1 sandbox", "3 sandboxes": an array's size or a number),
    or.TEXT (TEXT when unset).
*/
#ifndef GW_TEXT_H_INCLUDED
#define GW_TEXT_H_INCLUDED

#include <jansson.h>

#include "sbx_common.h"
#include "sbx_ops_gen.h"

typedef struct gw_text_t gw_text_t;

//  Loads the word tables (sbx_ops_words_json). NULL if they do not parse.
gw_text_t *gw_text_new (void);
void gw_text_destroy (gw_text_t **self_p);

//  op's text for answer (borrowed) and the call's args (borrowed: {@a}); a fresh UTF-8
//  string (the caller frees), "" for an operation without a text.
char *gw_text_render (gw_text_t *self, sbx_op_t op, json_t *answer, json_t *args);

//  The same for a template of one's own (self-tests).
char *gw_text_render_template (gw_text_t *self, const char *template, sbx_op_t op, json_t *answer,
                               json_t *args);

void gw_text_test (bool verbose);

#endif
