/*  fuzz_seeds - writes the generated seeds of the codec and agent_frame corpora.

    Usage: fuzz_seeds CORPUS_DIR   (writes CORPUS_DIR/codec/ and CORPUS_DIR/agent_frame/)

    Real frames from the codec itself: one message of every type, encoded (random
    fields from the schema tables, a fixed seed, so the output is the same each run),
    and for the agent channel, streams of agent.* frames as vmd reads them: each
    frame alone, and a few together, whole, in pieces and damaged. The
    hand-made seeds of the other targets are plain files in the repository.
*/
#include "sbx_msg.h"
#include "sbx_msg_meta.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define S_MAX_SEED 1500 //  keep the corpus small: smaller frames mutate faster too

static void s_write (const char *dir, const char *name, const uint8_t *data, size_t size)
{
    char path[512];
    snprintf (path, sizeof path, "%s/%s", dir, name);
    FILE *file = fopen (path, "wb");
    if (!file || fwrite (data, 1, size, file) != size || fclose (file) != 0) {
        fprintf (stderr, "fuzz_seeds: cannot write %s\n", path);
        exit (1);
    }
}

//  A small encoding of a random message of type t, or NULL.
static uint8_t *s_frame (sbx_msg_type_t t, uint64_t *seed, size_t *size_p)
{
    for (int round = 0; round < 50; round++) {
        sbx_msg_t *msg = sbx_meta_random_msg (t, false, seed);
        uint8_t *data = NULL;
        sbx_err_t err;
        int rc = msg ? sbx_msg_encode (msg, &data, size_p, &err) : -1;
        sbx_msg_destroy (&msg);
        if (rc == 0 && *size_p <= S_MAX_SEED)
            return data;
        free (data);
    }
    return NULL;
}

typedef struct {
    uint8_t *data;
    size_t size;
} s_stream_t;

static void s_put (s_stream_t *s, const void *data, size_t size)
{
    s->data = realloc (s->data, s->size + size);
    if (!s->data)
        exit (1);
    memcpy (s->data + s->size, data, size);
    s->size += size;
}

static void s_put_frame (s_stream_t *s, const uint8_t *data, size_t size)
{
    uint8_t head[4] = {(uint8_t) (size >> 24), (uint8_t) (size >> 16), (uint8_t) (size >> 8),
                       (uint8_t) size};
    s_put (s, head, 4);
    s_put (s, data, size);
}

int main (int argc, char *argv[])
{
    if (argc != 2) {
        fprintf (stderr, "usage: fuzz_seeds CORPUS_DIR\n");
        return 2;
    }
    char codec[400], agent[400];
    snprintf (codec, sizeof codec, "%s/codec", argv[1]);
    snprintf (agent, sizeof agent, "%s/agent_frame", argv[1]);
    mkdir (argv[1], 0755);
    mkdir (codec, 0755);
    mkdir (agent, 0755);
    uint64_t seed = 0x5eed;
    //  Streams, each after the byte that says in what pieces it arrives.
    s_stream_t whole = {0}, pieces = {0}, broken = {0};
    s_put (&whole, "\0", 1);
    s_put (&pieces, "\7", 1);
    s_put (&broken, "\1", 1);
    size_t frames = 0;
    for (int t = SBX_MSG__UNKNOWN + 1; t < SBX_MSG__COUNT; t++) {
        size_t size;
        uint8_t *data = s_frame ((sbx_msg_type_t) t, &seed, &size);
        if (!data)
            continue;
        s_write (codec, sbx_msg_type_name ((sbx_msg_type_t) t), data, size);
        const char *name = sbx_msg_type_name ((sbx_msg_type_t) t);
        if (strncmp (name, "agent.", 6) == 0 || t == SBX_MSG_ERROR) {
            //  One stream per frame, and three with a few frames each: small seeds keep
            //  the fuzzer fast (a stream fed a byte at a time is parsed thousands of times).
            s_stream_t one = {0};
            s_put (&one, "\0", 1);
            s_put_frame (&one, data, size);
            char file[128];
            snprintf (file, sizeof file, "stream_%s", name);
            s_write (agent, file, one.data, one.size);
            free (one.data);
            if (frames < 4) {
                s_put_frame (&whole, data, size);
                s_put_frame (&pieces, data, size);
                //  Damaged: a byte of the body, or a length off by one.
                if (frames % 3 == 1 && size > 8)
                    data[size / 2] ^= 0x5a;
                s_put_frame (&broken, data, frames % 3 == 2 ? size + 1 : size);
            }
            frames++;
        }
        free (data);
    }
    //  Lost its place: a zero length, then a length over the limit, then a good frame.
    static const uint8_t lost[] = {0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff};
    s_put (&broken, lost, sizeof lost);
    s_write (agent, "stream_whole", whole.data, whole.size);
    s_write (agent, "stream_pieces", pieces.data, pieces.size);
    s_write (agent, "stream_broken", broken.data, broken.size);
    free (whole.data);
    free (pieces.data);
    free (broken.data);
    printf ("fuzz_seeds: %d message types, %zu agent frames\n", SBX_MSG__COUNT - 1, frames);
    return 0;
}
